//! How a call is numbered.

/// Which counter numbers a call: the group's collectives share one; point-to-point
/// messages are counted per direction of each pair of ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sequence {
    /// The group's collective counter.
    Collective,
    /// Messages this rank sent to the peer.
    SentTo(usize),
    /// Messages this rank received from the peer.
    ReceivedFrom(usize),
}

impl Sequence {
    /// The peer of a point-to-point counter (`None`: the collective one).
    ///
    /// ```
    /// use ringccl_collectives::Sequence;
    /// assert_eq!(Sequence::ReceivedFrom(3).peer(), Some(3));
    /// assert_eq!(Sequence::Collective.peer(), None);
    /// ```
    pub fn peer(self) -> Option<usize> {
        match self {
            Sequence::Collective => None,
            Sequence::SentTo(peer) | Sequence::ReceivedFrom(peer) => Some(peer),
        }
    }
}
