//! The loader and the generated wrappers against fake CANN libraries built from
//! tests/fake_cann/fake_cann.c with `cc`: symbols resolve from the right file, arguments arrive in
//! the right slots, the op group is searched in torch_npu's order, and a symbol the library lacks
//! is `Error::SymbolNotFound`, not a panic.
//!
//! This file is its own test binary, so pointing `ASCEND_HOME_PATH` at the fake tree cannot race
//! the other test files; every test here calls `setup()` first.

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cannon_sys::loader::{self, Lib, Symbol};
use cannon_sys::{acl, aclnn, hccl, Error};

/// (library file, -D flag) for each fake.
const FAKES: [(&str, &str); 5] = [
    ("libascendcl.so", "FAKE_ACL"),
    ("libnnopbase.so", "FAKE_NNOPBASE"),
    ("libopapi_math.so", "FAKE_OPAPI_MATH"),
    ("libopapi.so", "FAKE_OPAPI"),
    ("libhccl.so", "FAKE_HCCL"),
];

/// Builds `<target tmp>/fake-cann-<pid>/lib64/*.so` once, points the loader at it and loads
/// every library.
fn setup() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("fake-cann-{}", std::process::id()));
        let lib64 = root.join("lib64");
        std::fs::create_dir_all(&lib64).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cann/fake_cann.c");
        for (name, define) in FAKES {
            let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                .args(["-shared", "-fPIC", "-O0", "-Wall", "-Werror"])
                .arg(format!("-D{define}"))
                .arg(&src)
                .arg("-o")
                .arg(lib64.join(name))
                .status()
                .expect("a C compiler (cc) is needed to build the fake CANN libraries");
            assert!(status.success(), "cc failed for {name}");
        }
        // Set before any loader use in this process; no other thread reads the environment
        // until this initialiser returns.
        std::env::set_var("ASCEND_HOME_PATH", &root);
        std::env::remove_var("ASCEND_TOOLKIT_HOME");
        // Load everything now (the loader caches handles for the process), then delete the
        // files: a loaded library stays mapped, and no build products pile up per run.
        for lib in Lib::ALL {
            loader::library(lib).unwrap();
        }
        std::fs::remove_dir_all(&root).unwrap();
        root
    })
}

#[test]
fn runtime_is_available_and_probe_reports_the_fake_paths() {
    let root = setup();
    assert!(cannon_sys::is_available());
    let probe = cannon_sys::probe();
    assert!(probe.runtime_available());
    let lib64 = root.join("lib64");
    let paths = |lib: Lib| {
        let p = probe.libraries.iter().find(|p| p.library == lib).unwrap();
        p.result.clone().unwrap()
    };
    let at = |name: &str| lib64.join(name).display().to_string();
    assert_eq!(paths(Lib::AscendCl), vec![at("libascendcl.so")]);
    assert_eq!(paths(Lib::NnopBase), vec![at("libnnopbase.so")]);
    assert_eq!(paths(Lib::Hccl), vec![at("libhccl.so")]);
    // torch_npu order: the split libopapi_*.so before libopapi.so.
    assert_eq!(
        paths(Lib::OpApi),
        vec![at("libopapi_math.so"), at("libopapi.so")]
    );
    let text = probe.to_string();
    assert!(
        text.contains(&format!("ASCEND_HOME_PATH     {}", root.display())),
        "{text}"
    );
    assert!(text.contains("ASCEND_TOOLKIT_HOME  (unset)"), "{text}");
}

#[test]
fn missing_symbol_is_an_error_not_a_panic() {
    setup();
    let expected = Error::SymbolNotFound {
        library: "libascendcl.so".into(),
        symbol: "aclrtMalloc".into(),
    };
    static RAW: Symbol = Symbol::new(Lib::AscendCl, c"aclrtMalloc");
    assert_eq!(RAW.get().unwrap_err(), expected);
    // The generated wrapper reports the same, and again on a second (cached) call.
    for _ in 0..2 {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: the call fails before reaching C (the fake has no aclrtMalloc).
        let r = unsafe { acl::aclrtMalloc(&mut ptr, 64, acl::ACL_MEM_MALLOC_HUGE_FIRST) };
        assert_eq!(r.unwrap_err(), expected);
    }
    assert_eq!(
        expected.to_string(),
        "symbol aclrtMalloc not found in libascendcl.so"
    );
}

#[test]
fn runtime_wrappers_pass_arguments_and_return_values() {
    setup();
    let mut count = 0u32;
    // SAFETY: valid out-pointer.
    assert_eq!(
        unsafe { acl::aclrtGetDeviceCount(&mut count) },
        Ok(acl::ACL_SUCCESS)
    );
    assert_eq!(count, 3);

    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: valid out-pointers.
    let r = unsafe { acl::aclrtGetVersion(&mut major, &mut minor, &mut patch) };
    assert_eq!((r, major, minor, patch), (Ok(0), 1, 17, 4));

    // aclrtMemcpy(dst, destMax, src, count, kind): the fake copies only for HOST_TO_HOST with
    // count <= destMax, so argument order is visible in both the status and the bytes.
    let src = [1u8, 2, 3, 4];
    let mut dst = [0u8; 8];
    let copy = |dst: &mut [u8], dest_max: usize, count: usize, kind| {
        // SAFETY: dst has at least dest_max bytes, src has at least `count` bytes when the
        // fake copies (it checks count <= dest_max, and the tests keep count <= 4).
        unsafe {
            acl::aclrtMemcpy(
                dst.as_mut_ptr().cast(),
                dest_max,
                src.as_ptr().cast(),
                count,
                kind,
            )
        }
    };
    assert_eq!(copy(&mut dst, 8, 4, acl::ACL_MEMCPY_HOST_TO_HOST), Ok(0));
    assert_eq!(dst, [1, 2, 3, 4, 0, 0, 0, 0]);
    assert_eq!(
        copy(&mut dst, 2, 4, acl::ACL_MEMCPY_HOST_TO_HOST),
        Ok(acl::ACL_ERROR_INVALID_PARAM)
    );
    assert_eq!(
        copy(&mut dst, 8, 4, acl::ACL_MEMCPY_HOST_TO_DEVICE),
        Ok(acl::ACL_ERROR_INVALID_PARAM)
    );

    // SAFETY: no arguments; the fake returns a static string.
    let msg = unsafe { acl::aclGetRecentErrMsg() }.unwrap();
    // SAFETY: non-null, NUL-terminated static string from the fake.
    assert_eq!(
        unsafe { CStr::from_ptr(msg) }.to_str(),
        Ok("fake acl: last error")
    );
}

/// Mirror of the fake's record of aclCreateTensor's arguments.
#[repr(C)]
struct FakeTensor {
    view_dims: *const i64,
    view_dims_num: u64,
    data_type: i32,
    stride: *const i64,
    offset: i64,
    format: i32,
    storage_dims: *const i64,
    storage_dims_num: u64,
    tensor_data: *mut c_void,
}

#[test]
fn create_tensor_arguments_land_in_documented_slots() {
    setup();
    let view = [4i64, 2];
    let stride = [1i64, 4];
    let storage = [2i64, 4];
    let mut data = [0f32; 8];
    let data_ptr: *mut c_void = data.as_mut_ptr().cast();
    // Distinct values per slot (offset 5 != format ND 2, dtype BF16 27), so any swap shows.
    // SAFETY: all pointers are valid for the lengths given; the fake only records them.
    let t = unsafe {
        aclnn::aclCreateTensor(
            view.as_ptr(),
            view.len() as u64,
            acl::ACL_BF16,
            stride.as_ptr(),
            5,
            acl::ACL_FORMAT_ND,
            storage.as_ptr(),
            storage.len() as u64,
            data_ptr,
        )
    }
    .unwrap();
    assert!(!t.is_null());
    // SAFETY: the fake returns a pointer to its static FakeTensor record.
    let rec = unsafe { &*(t as *const FakeTensor) };
    assert_eq!(rec.view_dims, view.as_ptr());
    assert_eq!(rec.view_dims_num, 2);
    assert_eq!(rec.data_type, acl::ACL_BF16);
    assert_eq!(rec.stride, stride.as_ptr());
    assert_eq!(rec.offset, 5);
    assert_eq!(rec.format, acl::ACL_FORMAT_ND);
    assert_eq!(rec.storage_dims, storage.as_ptr());
    assert_eq!(rec.storage_dims_num, 2);
    assert_eq!(rec.tensor_data, data_ptr);
    // SAFETY: t came from aclCreateTensor of the same library.
    assert_eq!(unsafe { aclnn::aclDestroyTensor(t) }, Ok(0));
    // SAFETY: NULL is a handled input of the fake.
    assert_eq!(
        unsafe { aclnn::aclDestroyTensor(std::ptr::null()) },
        Ok(161001)
    );
}

#[test]
fn op_symbols_follow_torch_npu_library_order() {
    setup();
    let mut ws = 0u64;
    let mut ex: *mut aclnn::aclOpExecutor = std::ptr::null_mut();
    let null = std::ptr::null();
    // Defined in libopapi_math.so (111) and libopapi.so (222): the split library wins.
    // SAFETY: the fake ignores the tensors and writes the two out-pointers.
    let r = unsafe {
        aclnn::aclnnMulGetWorkspaceSize(null, null, std::ptr::null_mut(), &mut ws, &mut ex)
    };
    assert_eq!((r, ws), (Ok(0), 111));
    // Only in libopapi.so; the int8 cubeMathType arrives intact (1000 + 3).
    // SAFETY: as above.
    let r = unsafe {
        aclnn::aclnnMatmulGetWorkspaceSize(null, null, std::ptr::null_mut(), 3, &mut ws, &mut ex)
    };
    assert_eq!((r, ws), (Ok(0), 1003));
    // In neither: the error names the group.
    // SAFETY: fails before reaching C.
    let r = unsafe { aclnn::aclnnSwiGluGetWorkspaceSize(null, -1, null, &mut ws, &mut ex) };
    assert_eq!(
        r.unwrap_err(),
        Error::SymbolNotFound {
            library: Lib::OpApi.name().into(),
            symbol: "aclnnSwiGluGetWorkspaceSize".into(),
        }
    );
}

#[test]
fn hccl_wrappers_resolve_from_libhccl() {
    setup();
    // SAFETY: plain enum argument; the fake returns static strings.
    let s = unsafe { hccl::HcclGetErrorString(hccl::HCCL_E_PARA) }.unwrap();
    // SAFETY: non-null static string.
    assert_eq!(unsafe { CStr::from_ptr(s) }.to_str(), Ok("fake: E_PARA"));
    let mut n = 0u32;
    // SAFETY: the fake checks the communicator for NULL and writes n otherwise.
    let r = unsafe { hccl::HcclGetRankSize(std::ptr::null_mut(), &mut n) };
    assert_eq!(r, Ok(hccl::HCCL_E_PTR));
    let mut fake_comm = 0u8;
    // SAFETY: non-null dummy communicator, valid out-pointer.
    let r = unsafe { hccl::HcclGetRankSize((&mut fake_comm as *mut u8).cast(), &mut n) };
    assert_eq!((r, n), (Ok(hccl::HCCL_SUCCESS), 8));
    // Same library handle as the loader's cache.
    assert_eq!(
        loader::library(Lib::Hccl).unwrap().paths(),
        vec![setup().join("lib64/libhccl.so").display().to_string()]
    );
}
