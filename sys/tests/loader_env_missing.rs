//! With `ASCEND_HOME_PATH` at an empty folder and `ASCEND_TOOLKIT_HOME` unset, nothing is found
//! and every error names the places searched. Its own test binary (one test) so setting the
//! environment cannot race other tests.

use cannon_sys::loader::{self, Lib, SearchDirs};
use cannon_sys::{acl, Error};

#[test]
fn empty_ascend_home_gives_typed_errors_listing_searched_paths() {
    let root = std::env::temp_dir().join(format!("cannon-sys-empty-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    std::env::set_var("ASCEND_HOME_PATH", &root);
    std::env::remove_var("ASCEND_TOOLKIT_HOME");

    // A machine whose default loader path already has CANN (ld.so.conf, LD_LIBRARY_PATH set at
    // process start) finds the library there whatever the variables say; nothing to check then.
    let default_only = SearchDirs::new([], true);
    if loader::open_uncached(Lib::AscendCl, &default_only).is_ok() {
        eprintln!("libascendcl.so is on the default loader path; skipping");
        return;
    }

    assert!(!cannon_sys::is_available());
    let lib64 = root.join("lib64");
    let expected = Error::LibraryNotFound {
        library: "libascendcl.so".into(),
        searched: vec![
            lib64.join("libascendcl.so").display().to_string(),
            "libascendcl.so (default dlopen search path)".into(),
        ],
    };
    assert_eq!(loader::library(Lib::AscendCl).unwrap_err(), expected);
    let msg = expected.to_string();
    assert!(
        msg.contains(&lib64.join("libascendcl.so").display().to_string()),
        "{msg}"
    );

    // A generated wrapper returns the library error instead of panicking.
    let mut n = 0u32;
    // SAFETY: fails before reaching C (no library).
    assert_eq!(
        unsafe { acl::aclrtGetDeviceCount(&mut n) }.unwrap_err(),
        expected
    );

    // The probe lists every library as missing, with where it looked.
    let probe = cannon_sys::probe();
    assert!(!probe.runtime_available());
    assert_eq!(
        probe.env[0],
        ("ASCEND_HOME_PATH", Some(root.display().to_string()))
    );
    assert_eq!(probe.env[1], ("ASCEND_TOOLKIT_HOME", None));
    for p in &probe.libraries {
        match &p.result {
            Err(Error::LibraryNotFound { searched, .. }) => {
                assert!(searched
                    .iter()
                    .any(|s| s.starts_with(&lib64.display().to_string())));
            }
            other => panic!("{}: expected LibraryNotFound, got {other:?}", p.library),
        }
    }
    let text = probe.to_string();
    assert!(text.contains("missing   libhccl.so; searched:"), "{text}");
    std::fs::remove_dir_all(&root).unwrap();
}
