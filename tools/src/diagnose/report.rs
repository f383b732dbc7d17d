//! The diagnosis as text: one headline per finding, most important first, with details
//! indented below it.

use std::fmt;

use super::finding::{CallRef, Culprit, Diagnosis, Finding, GroupDiagnosis, Suspect};

/// `"0, 1, 3"`; runs of three or more as `"4-7"`.
///
/// ```
/// use ringccl_tools::diagnose::rank_list;
///
/// assert_eq!(rank_list(&[0, 1, 3]), "0, 1, 3");
/// assert_eq!(rank_list(&[0, 4, 5, 6, 7]), "0, 4-7");
/// ```
pub fn rank_list(ranks: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j].saturating_add(1) {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", ranks[i], ranks[j]));
        } else {
            parts.extend(ranks[i..=j].iter().map(usize::to_string));
        }
        i = j + 1;
    }
    parts.join(", ")
}

/// `"rank 2"` or `"ranks 0, 1, 3"`.
fn ranks(list: &[usize]) -> String {
    match list {
        [one] => format!("rank {one}"),
        _ => format!("ranks {}", rank_list(list)),
    }
}

/// The verb for one rank or several: `("waits", "wait")`.
fn verb<'a>(list: &[usize], one: &'a str, many: &'a str) -> &'a str {
    if list.len() == 1 {
        one
    } else {
        many
    }
}

/// `"12.3 s"` from `at` to `now` (µs).
fn ago(now_us: u64, at_us: u64) -> String {
    let micros = now_us.saturating_sub(at_us);
    format!("{:.1} s", micros as f64 / 1e6)
}

fn culprit_text(culprit: &Culprit, now_us: u64) -> String {
    let rank = culprit.rank;
    match &culprit.state {
        Suspect::Idle {
            last_finished,
            finished_calls,
            last_seen_us,
            ..
        } => {
            let seen = last_seen_us
                .map(|at| format!(" (last seen {} ago)", ago(now_us, at)))
                .unwrap_or_default();
            match (last_finished, finished_calls) {
                (Some(call), _) => format!(
                    "rank {rank} last finished {} and has issued nothing since{seen}",
                    call.short()
                ),
                (None, Some(n)) if *n > 0 => format!(
                    "rank {rank} finished {n} calls and has issued nothing since{seen} \
                     (from its beacon; its dump is missing)"
                ),
                _ => format!("rank {rank} has issued no call at all"),
            }
        }
        Suspect::Exited {
            exit,
            last_finished,
            finished_calls,
            in_call,
        } => {
            let when = format!(
                "rank {rank} exited ({}) {} ago",
                exit.status,
                ago(now_us, exit.at_us)
            );
            match (in_call, last_finished, finished_calls) {
                (Some(call), _, _) => format!("{when}, in {}", call.label()),
                (None, Some(call), _) => format!("{when}; it last finished {}", call.short()),
                (None, None, Some(n)) => format!("{when}; it had finished {n} calls"),
                (None, None, None) => when,
            }
        }
        Suspect::Busy { call, since_us } => {
            let since = since_us
                .map(|at| format!(" (in it for {})", ago(now_us, at)))
                .unwrap_or_default();
            format!(
                "rank {rank} is in {} but not waiting for any peer{since}",
                call.label()
            )
        }
        Suspect::Queued { call } => {
            format!("rank {rank} issued {} but it has not started", call.label())
        }
        Suspect::Failed { call, error } => {
            format!("rank {rank}'s {} failed: {error}", call.label())
        }
        Suspect::NoData { alive: Some(true) } => format!(
            "rank {rank} left no flight dump though its process runs (is RINGCCL_FLIGHT_DIR \
             reaching it?)"
        ),
        Suspect::NoData { .. } => format!("there is no flight dump from rank {rank}"),
        Suspect::Elsewhere => format!("rank {rank} runs on another node (not seen from here)"),
    }
}

/// Details under a headline: hints about idle culprits.
fn culprit_hints(culprits: &[Culprit], details: &mut Vec<String>) {
    for culprit in culprits {
        if let Suspect::Idle {
            alive: Some(true), ..
        } = culprit.state
        {
            details.push(format!(
                "rank {}'s process is running: it is busy outside ringccl (compute, I/O, a \
                 lock) or it skipped this collective",
                culprit.rank
            ));
        }
    }
}

fn chain_text(chain: &[usize]) -> String {
    let mut steps = Vec::new();
    for pair in chain.windows(2) {
        if steps.is_empty() {
            steps.push(format!("rank {} waits for {}", pair[0], pair[1]));
        } else {
            steps.push(format!("{} for {}", pair[0], pair[1]));
        }
    }
    steps.join(", ")
}

fn culprits_text(culprits: &[Culprit], now_us: u64) -> String {
    culprits
        .iter()
        .map(|c| culprit_text(c, now_us))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The headline and details of one finding.
fn finding_text(finding: &Finding, now_us: u64) -> (String, Vec<String>) {
    let mut details = Vec::new();
    let headline = match finding {
        Finding::Mismatch { op, calls } => {
            let describe = |(desc, list): &(String, Vec<usize>)| {
                format!(
                    "{} {} in op #{op} {desc}",
                    ranks(list),
                    verb(list, "is", "are")
                )
            };
            let odd: Vec<String> = calls.iter().skip(1).map(describe).collect();
            match calls.first() {
                Some(first) if !odd.is_empty() => {
                    format!("{} but {}", odd.join(" and "), describe(first))
                }
                _ => format!("ranks disagree on op #{op}"),
            }
        }
        Finding::Waiting {
            call,
            waiters,
            culprits,
            chains,
        } => {
            let wait = format!(
                "{} {} in {}",
                ranks(waiters),
                verb(waiters, "waits", "wait"),
                call.label()
            );
            for chain in chains {
                details.push(chain_text(chain));
            }
            culprit_hints(culprits, &mut details);
            if culprits.is_empty() {
                format!("{wait}; no rank was found holding them up")
            } else {
                let who: Vec<usize> = culprits.iter().map(|c| c.rank).collect();
                format!(
                    "{wait} for {}; {}",
                    ranks(&who),
                    culprits_text(culprits, now_us)
                )
            }
        }
        Finding::Failed {
            call,
            ranks: failed,
            error,
            culprits,
        } => {
            let head = format!("{} failed in {}: {error}", ranks(failed), call.label());
            culprit_hints(culprits, &mut details);
            if culprits.is_empty() {
                head
            } else {
                format!("{head}; {}", culprits_text(culprits, now_us))
            }
        }
        Finding::Cycle { ranks: circle } => {
            let list: Vec<usize> = circle.iter().map(|(r, _)| *r).collect();
            let steps: Vec<String> = circle
                .iter()
                .enumerate()
                .map(|(i, (rank, call))| {
                    let next = circle.get((i + 1) % circle.len()).map_or(*rank, |c| c.0);
                    format!("rank {rank} in {} for rank {next}", call.label())
                })
                .collect();
            format!("{} wait for each other: {}", ranks(&list), steps.join(", "))
        }
        Finding::Exited {
            rank,
            exit,
            last_finished,
        } => {
            let after = last_finished
                .as_ref()
                .map(|c| format!("; it last finished {}", c.short()))
                .unwrap_or_default();
            format!(
                "rank {rank} exited ({}) {} ago{after}",
                exit.status,
                ago(now_us, exit.at_us)
            )
        }
    };
    (headline, details)
}

fn last_progress_text(group: &GroupDiagnosis, now_us: u64) -> String {
    match &group.last_progress {
        Some((rank, call, at)) => format!(
            "the last call to finish was rank {rank}'s {}, {} ago",
            call.label(),
            ago(now_us, *at)
        ),
        None => "no call has finished".into(),
    }
}

/// The group's name in front of its lines, for groups formed from the first one.
fn prefix(group: &GroupDiagnosis) -> String {
    if group.group == ringccl::flight::MAIN_GROUP {
        String::new()
    } else {
        format!("in group {}: ", group.group)
    }
}

fn named(finding: &Finding) -> Vec<usize> {
    match finding {
        Finding::Waiting { culprits, .. } | Finding::Failed { culprits, .. } => {
            culprits.iter().map(|c| c.rank).collect()
        }
        Finding::Exited { rank, .. } => vec![*rank],
        _ => Vec::new(),
    }
}

impl Diagnosis {
    /// The diagnosis as lines: each finding's headline (most important first) followed by
    /// its details, indented; then what is missing from the evidence.
    ///
    /// ```
    /// use ringccl_tools::diagnose::{diagnose, Evidence};
    ///
    /// let lines = diagnose(&Evidence::at(0)).lines();
    /// assert_eq!(lines.len(), 1);
    /// ```
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for group in &self.groups {
            let prefix = prefix(group);
            for finding in &group.findings {
                let (headline, details) = finding_text(finding, self.now_us);
                lines.push(format!("{prefix}{headline}"));
                lines.extend(details.into_iter().map(|d| format!("  {d}")));
            }
        }
        if !self.groups.iter().any(|g| !g.findings.is_empty()) {
            lines.push(self.quiet_text());
        }
        for group in &self.groups {
            let named: Vec<usize> = group.findings.iter().flat_map(named).collect();
            let missing: Vec<usize> = group
                .missing
                .iter()
                .copied()
                .filter(|r| !named.contains(r))
                .collect();
            if !missing.is_empty() {
                lines.push(format!(
                    "  {}no flight dump from {}",
                    prefix(group),
                    ranks(&missing)
                ));
            }
        }
        if let Some(local) = &self.local_ranks {
            lines.push(format!(
                "  this covers the ranks started on this node ({}) only; for the whole job, \
                 gather every node's flight files in one directory and run `ringrun diagnose \
                 DIR`",
                rank_list(local)
            ));
        }
        lines.extend(self.notes.iter().map(|n| format!("  {n}")));
        lines
    }

    /// The first line: the most important finding.
    ///
    /// ```
    /// use ringccl_tools::diagnose::{diagnose, Evidence};
    ///
    /// assert!(diagnose(&Evidence::at(0)).headline().starts_with("no flight dump"));
    /// ```
    pub fn headline(&self) -> String {
        self.lines().into_iter().next().unwrap_or_default()
    }

    /// What to say when nothing was found.
    fn quiet_text(&self) -> String {
        let Some(main) = self.groups.first() else {
            return "no flight dump or beacon was found".into();
        };
        if main.in_flight {
            format!(
                "calls are queued but none runs or waits; {}",
                last_progress_text(main, self.now_us)
            )
        } else {
            format!(
                "no hang: no rank has a call in flight; {}",
                last_progress_text(main, self.now_us)
            )
        }
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines().join("\n"))
    }
}

impl fmt::Display for CallRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}
