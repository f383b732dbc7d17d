//! `InitOptions::from_env` against the real process environment. The only test in this
//! binary, so changing the environment races with nothing.

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
    assert_eq!(opts.get_local_rank(), Some(1));

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
