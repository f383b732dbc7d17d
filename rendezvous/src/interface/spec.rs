//! Which network interfaces a `RINGCCL_SOCKET_IFNAME` value names, in NCCL's syntax
//! (`NCCL_SOCKET_IFNAME`): parsing and matching one interface name. Pure.

use std::fmt;
use std::str::FromStr;

/// The longest interface name Linux allows (`IFNAMSIZ` less its NUL).
const MAX_NAME: usize = 15;

/// A set of network interfaces, named as `NCCL_SOCKET_IFNAME` and
/// `GLOO_SOCKET_IFNAME` name them:
///
/// - `eth` — every interface whose name starts with `eth` (`eth0`, `eth1`, `eth01` …);
/// - `ib0,eth1` — a comma-separated list of such prefixes: an interface matching any;
/// - `^lo,docker` — every interface matching *none* of the prefixes;
/// - `=eth0` (and `=ib0,eth1`) — exact names instead of prefixes; `^=lo` excludes
///   exact names.
///
/// Blanks around the names and empty entries (`eth0,`) are ignored, as NCCL ignores
/// them.
///
/// ```
/// use ringccl_rendezvous::InterfaceSpec;
///
/// let fast: InterfaceSpec = "ib,eth1".parse()?;
/// assert!(fast.matches("ib0") && fast.matches("eth1") && fast.matches("eth10"));
/// assert!(!fast.matches("eth0"));
/// let not_local: InterfaceSpec = "^lo,docker".parse()?;
/// assert!(not_local.matches("eth0") && !not_local.matches("docker0"));
/// let exact: InterfaceSpec = "=eth1".parse()?;
/// assert!(exact.matches("eth1") && !exact.matches("eth10"));
/// assert!("^".parse::<InterfaceSpec>().is_err());
/// # Ok::<(), ringccl_rendezvous::InterfaceSpecError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceSpec {
    /// `^`: the interfaces that match none of the names.
    exclude: bool,
    /// `=`: names are whole names, not prefixes.
    exact: bool,
    /// The names (or prefixes), never empty.
    names: Vec<String>,
}

/// Why a `RINGCCL_SOCKET_IFNAME` value is not a valid interface list; the message
/// says what is wrong and shows the syntax.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceSpecError {
    reason: String,
}

impl fmt::Display for InterfaceSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}; expected NCCL's syntax: `eth0` (names starting with eth0), `ib0,eth1` \
             (a comma list), `^lo,docker` (all but these), `=eth0` (exact names; `^=` \
             excludes exact names)",
            self.reason
        )
    }
}

impl std::error::Error for InterfaceSpecError {}

impl InterfaceSpec {
    /// Whether the interface called `name` belongs to the set.
    ///
    /// ```
    /// let spec: ringccl_rendezvous::InterfaceSpec = "^=lo".parse()?;
    /// assert!(!spec.matches("lo"));
    /// assert!(spec.matches("lo2"));
    /// # Ok::<(), ringccl_rendezvous::InterfaceSpecError>(())
    /// ```
    pub fn matches(&self, name: &str) -> bool {
        let named = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        named != self.exclude
    }
}

impl FromStr for InterfaceSpec {
    type Err = InterfaceSpecError;

    fn from_str(text: &str) -> Result<InterfaceSpec, InterfaceSpecError> {
        let invalid = |reason: String| InterfaceSpecError { reason };
        let mut rest = text.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        if names.is_empty() {
            return Err(invalid(format!("{text:?} names no interface")));
        }
        for name in &names {
            if let Some(bad) = name
                .chars()
                .find(|&c| c.is_whitespace() || matches!(c, '^' | '=' | '/' | ':'))
            {
                let why = match bad {
                    '^' | '=' => format!(
                        "{bad:?} may only open the whole list (`^` first, then `=`), \
                         not appear inside it"
                    ),
                    ':' => "ports are not part of an interface name".to_string(),
                    _ => "interface names contain no blanks or '/'".to_string(),
                };
                return Err(invalid(format!("{text:?}: in {name:?}, {why}")));
            }
            if name.len() > MAX_NAME {
                return Err(invalid(format!(
                    "{text:?}: {name:?} is longer than any interface name can be \
                     ({MAX_NAME} characters)"
                )));
            }
        }
        Ok(InterfaceSpec {
            exclude,
            exact,
            names,
        })
    }
}

impl fmt::Display for InterfaceSpec {
    /// The spec in NCCL's syntax, normalised (`^=a,b`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let exclude = if self.exclude { "^" } else { "" };
        let exact = if self.exact { "=" } else { "" };
        write!(f, "{exclude}{exact}{}", self.names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> InterfaceSpec {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    fn matching<'a>(text: &str, names: &[&'a str]) -> Vec<&'a str> {
        let spec = spec(text);
        names.iter().copied().filter(|n| spec.matches(n)).collect()
    }

    const HOST: [&str; 7] = ["lo", "eth0", "eth01", "eth1", "ib0", "docker0", "enp3s0"];

    #[test]
    fn a_name_is_a_prefix() {
        assert_eq!(matching("eth0", &HOST), ["eth0", "eth01"]);
        assert_eq!(matching("eth", &HOST), ["eth0", "eth01", "eth1"]);
        assert_eq!(matching("e", &HOST), ["eth0", "eth01", "eth1", "enp3s0"]);
        assert_eq!(matching("wlan", &HOST), Vec::<&str>::new());
    }

    #[test]
    fn a_list_matches_any_of_its_names() {
        assert_eq!(matching("ib0,eth1", &HOST), ["eth1", "ib0"]);
        assert_eq!(matching(" ib , docker ", &HOST), ["ib0", "docker0"]);
        // Empty entries are ignored, as NCCL ignores them.
        assert_eq!(matching("eth1,,", &HOST), ["eth1"]);
    }

    #[test]
    fn a_caret_excludes() {
        assert_eq!(
            matching("^lo,docker", &HOST),
            ["eth0", "eth01", "eth1", "ib0", "enp3s0"]
        );
        assert_eq!(matching("^e", &HOST), ["lo", "ib0", "docker0"]);
    }

    #[test]
    fn an_equals_sign_asks_for_exact_names() {
        assert_eq!(matching("=eth0", &HOST), ["eth0"]);
        assert_eq!(matching("=eth", &HOST), Vec::<&str>::new());
        assert_eq!(matching("=eth1,ib0", &HOST), ["eth1", "ib0"]);
        assert_eq!(
            matching("^=eth0,lo", &HOST),
            ["eth01", "eth1", "ib0", "docker0", "enp3s0"]
        );
    }

    #[test]
    fn malformed_specs_say_what_is_wrong() {
        for (text, says) in [
            ("", "names no interface"),
            ("  ", "names no interface"),
            ("^", "names no interface"),
            ("^=", "names no interface"),
            (",,", "names no interface"),
            ("eth0,^lo", "may only open the whole list"),
            ("=^lo", "may only open the whole list"),
            ("eth0=", "may only open the whole list"),
            ("eth0:29500", "ports"),
            ("eth 0", "no blanks"),
            ("a/b", "no blanks or '/'"),
            ("averyverylongname", "longer than any interface name"),
        ] {
            let err = text
                .parse::<InterfaceSpec>()
                .expect_err(&format!("{text:?} should be refused"));
            let message = err.to_string();
            assert!(message.contains(says), "{text:?}: {message}");
            assert!(message.contains("NCCL's syntax"), "{text:?}: {message}");
        }
        // Fifteen characters is still a name.
        assert!("abcdefghijklmno".parse::<InterfaceSpec>().is_ok());
    }

    #[test]
    fn display_is_the_normalised_spec() {
        assert_eq!(spec(" ^= lo , eth0 ,").to_string(), "^=lo,eth0");
        assert_eq!(spec("ib").to_string(), "ib");
        assert_eq!(spec(&spec("^docker,lo").to_string()), spec("^docker,lo"));
    }
}
