//! Groups formed from a group: `ProcessGroup::new_group` and `ProcessGroup::split`, over
//! TCP and shared memory, nested, and refused alike on every rank when the ranks ask for
//! different things.

use crate::common;

use std::time::{Duration, Instant};

use common::{heavy_lock, run_threads, run_threads_with};
use ringccl::{Error, ProcessGroup, ReduceOp, TransportKind};

/// The group's deadline: long, so that only a real failure ends calls early.
const LONG: Duration = Duration::from_secs(120);
/// Upper bound for a whole test on a loaded 2-core machine.
const PROMPT: Duration = Duration::from_secs(60);

/// Sum over `group` of `(parent rank + 1)`, by all-reduce in the group.
fn sum_of_parent_ranks(group: &ProcessGroup, parent_rank: usize) -> f32 {
    let mut x = [parent_rank as f32 + 1.0; 3];
    group.all_reduce(&mut x, ReduceOp::Sum).expect("all_reduce");
    assert!(x.iter().all(|&v| v == x[0]), "{x:?}");
    x[0]
}

fn new_group_of_ranks_1_and_3(transport: TransportKind) {
    let _guard = heavy_lock();
    let started = Instant::now();
    let results = run_threads_with(
        4,
        LONG,
        |opts| opts.transport(transport),
        |pg| {
            let rank = pg.rank();
            // Any order: numbered by rank here.
            let sub = pg.new_group(&[3, 1]).expect("new_group");
            let inside = sub.as_ref().map(|g| {
                assert_eq!(g.backend(), "gloo");
                (g.rank(), g.world_size(), sum_of_parent_ranks(g, rank))
            });
            // The parent goes on working beside it.
            let whole = sum_of_parent_ranks(&pg, rank);
            // And the group once more after the parent's call.
            let again = sub.as_ref().map(|g| sum_of_parent_ranks(g, rank));
            (inside, whole, again)
        },
    );
    assert_eq!(results[0], (None, 10.0, None));
    assert_eq!(results[1], (Some((0, 2, 6.0)), 10.0, Some(6.0)));
    assert_eq!(results[2], (None, 10.0, None));
    assert_eq!(results[3], (Some((1, 2, 6.0)), 10.0, Some(6.0)));
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

#[test]
fn new_group_connects_only_the_listed_ranks_over_tcp() {
    new_group_of_ranks_1_and_3(TransportKind::Tcp);
}

#[test]
fn new_group_connects_only_the_listed_ranks_over_shared_memory() {
    new_group_of_ranks_1_and_3(TransportKind::SharedMemory);
}

#[test]
fn split_by_colour_and_split_again() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let results = run_threads(4, LONG, |pg| {
        let rank = pg.rank();
        // Colours: ranks 0, 2 → 0; ranks 1, 3 → 1.
        let half = pg
            .split(Some(rank as u32 % 2))
            .expect("split")
            .expect("member");
        let in_half = (
            half.rank(),
            half.world_size(),
            sum_of_parent_ranks(&half, rank),
        );
        // Nested: the half splits again, only its rank 0 takes a colour.
        let colour = (half.rank() == 0).then_some(7);
        let single = half.split(colour).expect("split the half");
        let in_single = single.map(|g| (g.world_size(), sum_of_parent_ranks(&g, rank)));
        // A rank that passes no colour joins nothing.
        let none = pg
            .split((rank != 2).then_some(0))
            .expect("split without rank 2");
        let in_three = none.map(|g| sum_of_parent_ranks(&g, rank));
        (in_half, in_single, in_three)
    });
    assert_eq!(results[0], ((0, 2, 4.0), Some((1, 1.0)), Some(7.0)));
    assert_eq!(results[1], ((0, 2, 6.0), Some((1, 2.0)), Some(7.0)));
    assert_eq!(results[2], ((1, 2, 4.0), None, None));
    assert_eq!(results[3], ((1, 2, 6.0), None, Some(7.0)));
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

#[test]
fn ranks_that_ask_for_different_groups_all_get_the_same_error_at_once() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let errors = run_threads(3, LONG, |pg| {
        let began = Instant::now();
        let ranks: &[usize] = if pg.rank() == 2 { &[0, 1, 2] } else { &[0, 1] };
        let outcome = pg.new_group(ranks);
        let error = match outcome {
            Err(e) => e,
            Ok(g) => panic!("rank {}: formed {g:?}", pg.rank()),
        };
        // The parent is still usable: nothing was connected.
        let whole = sum_of_parent_ranks(&pg, pg.rank());
        // Bad lists are refused alike everywhere.
        let out_of_range = pg.new_group(&[0, 5]).map(|g| g.is_some());
        let twice = pg.new_group(&[1, 1]).map(|g| g.is_some());
        (error, began.elapsed(), whole, out_of_range, twice)
    });
    for (rank, (error, took, whole, out_of_range, twice)) in errors.iter().enumerate() {
        let text = error.to_string();
        assert!(
            matches!(error, Error::InvalidArgument(_)),
            "rank {rank}: {error:?}"
        );
        assert!(
            text.contains("rank 2 called new_group") && text.contains("different list of ranks"),
            "rank {rank}: {text}"
        );
        assert!(*took < Duration::from_secs(10), "rank {rank}: {took:?}");
        assert_eq!(*whole, 6.0);
        let out_of_range = out_of_range.as_ref().unwrap_err().to_string();
        assert!(out_of_range.contains("rank 5"), "{out_of_range}");
        let twice = twice.as_ref().unwrap_err().to_string();
        assert!(twice.contains("rank 1 twice"), "{twice}");
    }
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

#[test]
fn a_group_of_one_forms_groups_and_groups_of_groups_nest() {
    let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))
        .expect("init");
    // Forming works on a real group of one…
    let one = pg.new_group(&[0]).expect("new_group").expect("member");
    assert_eq!((one.rank(), one.world_size()), (0, 1));
    // …and a group's own groups can form groups too.
    let two_deep = one.split(Some(3)).expect("split").expect("member");
    assert_eq!(two_deep.world_size(), 1);
    let mut x = [4.0f32];
    two_deep
        .all_reduce(&mut x, ReduceOp::Max)
        .expect("all_reduce");
    assert_eq!(x, [4.0]);
}
