//! `InitOptions::from_env` against the real process environment (the only test in this
//! binary that changes it, so it races with nothing), and `from_vars` for the rest.

use std::time::Duration;

use ringccl::{Error, InitOptions};

#[test]
fn from_env_reads_torchrun_variables_and_names_what_is_missing() {
    let set = |k: &str, v: &str| std::env::set_var(k, v);
    set("RANK", "3");
    set("WORLD_SIZE", "8");
    set("MASTER_ADDR", "node0");
    set("MASTER_PORT", "29400");
    set("LOCAL_RANK", "1");
    let opts = InitOptions::from_env().unwrap();
    assert_eq!((opts.rank(), opts.world_size()), (3, 8));
    assert_eq!(opts.master(), "node0:29400");
    assert_eq!(opts.local_rank, Some(1));

    set("RANK", "8");
    let err = InitOptions::from_env().unwrap_err();
    assert!(
        matches!(err, Error::InvalidEnv { var: "RANK", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("WORLD_SIZE=8"), "{err}");
    set("RANK", "3");

    for var in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
        let old = std::env::var(var).unwrap();
        std::env::remove_var(var);
        let err = InitOptions::from_env().unwrap_err();
        assert!(
            matches!(err, Error::MissingEnv { var: v, .. } if v == var),
            "{err:?}"
        );
        assert!(err.to_string().contains(var), "{err}");
        set(var, &old);
    }
}

#[test]
fn security_and_liveness_variables_are_read_and_checked() {
    let vars = |extra: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            [
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29500"),
            ]
            .iter()
            .chain(extra)
            .find(|v| v.0 == k)
            .map(|v| v.1.to_string())
        }
    };
    let opts = InitOptions::from_vars(vars(&[
        ("RINGCCL_AUTH_TOKEN", "s3cret"),
        ("RINGCCL_DEAD_PEER_TIMEOUT", "12.5"),
    ]))
    .unwrap();
    assert!(opts.auth_token.is_some());
    assert!(
        !format!("{opts:?}").contains("s3cret"),
        "the token never shows"
    );
    assert_eq!(opts.dead_peer_timeout, Duration::from_secs_f64(12.5));
    let defaults = InitOptions::from_vars(vars(&[])).unwrap();
    assert!(defaults.auth_token.is_none());
    assert_eq!(
        defaults.dead_peer_timeout,
        ringccl::DEFAULT_DEAD_PEER_TIMEOUT
    );
    for bad in [
        &[("RINGCCL_AUTH_TOKEN", "")][..],
        &[("RINGCCL_DEAD_PEER_TIMEOUT", "0.1")][..],
        &[("RINGCCL_DEAD_PEER_TIMEOUT", "soon")][..],
    ] {
        let err = InitOptions::from_vars(vars(bad)).unwrap_err();
        assert!(err.to_string().contains(bad[0].0), "{err}");
    }
}
