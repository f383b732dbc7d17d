//! Reading Slurm's compressed node lists.

/// The first host of a Slurm node list: `node[01-04,07],gpu5` → `node01`.
pub(super) fn first_slurm_host(nodelist: &str) -> Option<String> {
    let list = nodelist.trim();
    // The first entry ends at the first comma outside brackets.
    let mut depth = 0i32;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    let first = &list[..end];
    let host = match first.split_once('[') {
        None => first.to_string(),
        Some((prefix, rest)) => {
            let range = rest.split([',', ']']).next()?;
            let start = range.split('-').next()?;
            if start.is_empty() || !start.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            format!("{prefix}{start}")
        }
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::first_slurm_host;

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_slurm_host("node01").as_deref(), Some("node01"));
        assert_eq!(
            first_slurm_host("node[01-04,07]").as_deref(),
            Some("node01")
        );
        assert_eq!(first_slurm_host("a[3,5],b7").as_deref(), Some("a3"));
        assert_eq!(first_slurm_host("x1,y[2-3]").as_deref(), Some("x1"));
        assert_eq!(first_slurm_host("n[]"), None);
        assert_eq!(first_slurm_host(""), None);
    }
}
