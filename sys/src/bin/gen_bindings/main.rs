//! Regenerates sys/src/generated/{acl,hccl,aclnn}.rs from the CANN headers.
//!
//! ```text
//! cargo run -p cannon-sys --features bindgen --bin gen-bindings -- --headers DIR [--out DIR]
//! ```
//! DIR is the `torch_npu/include` folder of the unpacked torch-npu==2.14.0 wheel. Needs libclang
//! at run time (`apt-get install libclang-dev`). Output is deterministic: no absolute paths, no
//! clang version, files listed in sorted order.

mod allowlist;
mod rewrite;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use allowlist::ModuleSpec;

/// What the checked-in files say they were generated from (CI's .ci/check-bindings uses this
/// wheel; pass `--source` when generating from something else).
const DEFAULT_SOURCE: &str = "torch-npu==2.14.0 wheel (PyPI), torch_npu/include";

struct Args {
    headers: PathBuf,
    out: PathBuf,
    source: String,
}

fn usage() -> String {
    "usage: gen-bindings --headers <torch_npu/include> [--out <dir>] [--source <label>]".to_owned()
}

fn parse_args() -> Result<Args, String> {
    let mut headers = None;
    let mut out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/generated");
    let mut source = DEFAULT_SOURCE.to_owned();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{}", usage()))
        };
        match flag.as_str() {
            "--headers" => headers = Some(PathBuf::from(value()?)),
            "--out" => out = PathBuf::from(value()?),
            "--source" => source = value()?,
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    let headers = headers.ok_or_else(usage)?;
    Ok(Args {
        headers,
        out,
        source,
    })
}

/// Records every header clang opens, to list them in the output's header comment.
#[derive(Debug, Default)]
struct IncludeLog(Arc<Mutex<BTreeSet<String>>>);

impl bindgen::callbacks::ParseCallbacks for IncludeLog {
    fn include_file(&self, filename: &str) {
        if let Ok(mut set) = self.0.lock() {
            set.insert(filename.to_owned());
        }
    }

    /// rt_error_codes.h `#define`s its aclError codes; give them aclError's type (`int`) like
    /// the `static const int` codes of acl_base_rt.h instead of bindgen's default `u32`.
    fn int_macro(&self, name: &str, _value: i64) -> Option<bindgen::callbacks::IntKind> {
        name.starts_with("ACL_ERROR_")
            .then_some(bindgen::callbacks::IntKind::Int)
    }
}

/// `path` relative to one of `roots` (shown with the root's label), or None for system headers.
fn relative(path: &str, roots: &[(&Path, &str)]) -> Option<String> {
    let canon = std::fs::canonicalize(path).ok()?;
    roots.iter().find_map(|(root, label)| {
        canon
            .strip_prefix(root)
            .ok()
            .map(|r| format!("{label}{}", r.display()))
    })
}

fn generate(spec: &ModuleSpec, args: &Args, sys_include: &Path) -> Result<String, String> {
    let headers = std::fs::canonicalize(&args.headers)
        .map_err(|e| format!("--headers {}: {e}", args.headers.display()))?;
    let log = IncludeLog::default();
    let seen = Arc::clone(&log.0);
    let mut b = bindgen::Builder::default()
        .header_contents(
            &format!("gen_{}.h", spec.file.trim_end_matches(".rs")),
            spec.wrapper,
        )
        .clang_arg(format!("-I{}", headers.display()))
        .clang_arg(format!("-I{}", sys_include.display()))
        .generate_comments(false)
        .disable_header_comment()
        .layout_tests(true)
        .derive_default(false)
        .prepend_enum_name(false)
        .merge_extern_blocks(true)
        .formatter(bindgen::Formatter::None)
        .rust_target(bindgen::RustTarget::stable(85, 0).map_err(|e| e.to_string())?)
        .parse_callbacks(Box::new(log));
    if spec.cplusplus {
        b = b.clang_args(["-xc++", "-std=c++14"]);
    }
    for f in spec.all_functions() {
        b = b.allowlist_function(f);
    }
    for t in spec.types {
        b = b.allowlist_type(t);
    }
    for v in spec.vars {
        b = b.allowlist_var(v);
    }
    for t in spec.imported {
        b = b.blocklist_type(t);
    }
    let bindings = b
        .generate()
        .map_err(|e| format!("{}: bindgen: {e}", spec.file))?;

    let mut file: syn::File =
        syn::parse_str(&bindings.to_string()).map_err(|e| format!("{}: {e}", spec.file))?;
    let rewritten = rewrite::rewrite(&mut file, spec)?;
    let missing: Vec<&str> = spec
        .all_functions()
        .filter(|f| !rewritten.contains(*f))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{}: not declared in the headers: {}",
            spec.file,
            missing.join(", ")
        ));
    }
    if !spec.imported.is_empty() {
        let names = spec.imported.iter().map(|t| quote::format_ident!("{t}"));
        file.items
            .insert(0, syn::parse_quote!(pub use super::acl::{#(#names),*};));
    }
    let body = rewrite::insert_safety_comments(&prettyplease::unparse(&file))?;

    let roots = [
        (headers.as_path(), "<headers>/"),
        (sys_include, "sys/include/"),
    ];
    let read: BTreeSet<String> = seen
        .lock()
        .map_err(|_| "include log poisoned".to_owned())?
        .iter()
        .filter_map(|p| relative(p, &roots))
        .collect();
    Ok(header_comment(spec, args, &headers, &read)? + &body)
}

/// `ACL_MAJOR.MINOR.PATCH` from the runtime header, recorded as the header version.
fn acl_version(headers: &Path) -> Result<String, String> {
    let path = headers.join("acl/acl_rt.h");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let part = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix("#define ")?
                    .trim()
                    .strip_prefix(name)?
                    .split_whitespace()
                    .next()
            })
            .map(str::to_owned)
            .ok_or_else(|| format!("{name} not found in acl/acl_rt.h"))
    };
    Ok(format!(
        "{}.{}.{}",
        part("ACL_MAJOR_VERSION")?,
        part("ACL_MINOR_VERSION")?,
        part("ACL_PATCH_VERSION")?
    ))
}

fn header_comment(
    spec: &ModuleSpec,
    args: &Args,
    headers: &Path,
    read: &BTreeSet<String>,
) -> Result<String, String> {
    let mut s = String::new();
    s.push_str("// @generated by gen-bindings (sys/src/bin/gen_bindings). Do not edit by hand:\n");
    s.push_str(
        "// change sys/src/bin/gen_bindings/allowlist.rs or sys/include/cannon_aclnn.h, then\n",
    );
    s.push_str(
        "// cargo run -p cannon-sys --features bindgen --bin gen-bindings -- --headers <headers>\n",
    );
    s.push_str(&format!(
        "// Headers: {} (AscendCL {})\n",
        args.source,
        acl_version(headers)?
    ));
    s.push_str("// Files read:\n");
    for f in read {
        s.push_str(&format!("//   {f}\n"));
    }
    s.push_str(&format!("//! {}\n", spec.title));
    s.push_str("//!\n");
    s.push_str(
        "//! bindgen output with each C function turned into an `unsafe fn` that resolves\n",
    );
    s.push_str("//! itself through `crate::loader` on first call and returns\n");
    s.push_str("//! `Result<C return type, crate::Error>` (see sys/README.md).\n");
    s.push_str("#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]\n");
    s.push_str("#![allow(clippy::too_many_arguments, clippy::useless_transmute)]\n");
    s.push_str("#![cfg_attr(rustfmt, rustfmt::skip)]\n");
    Ok(s)
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let sys_include =
        std::fs::canonicalize(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include"))
            .map_err(|e| format!("sys/include: {e}"))?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    for spec in allowlist::modules() {
        let text = generate(&spec, &args, &sys_include)?;
        let path = args.out.join(spec.file);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("gen-bindings: {e}");
        std::process::exit(1);
    }
}
