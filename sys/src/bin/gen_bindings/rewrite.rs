//! Turns bindgen's `extern "C" { fn f(args) -> R; }` declarations into functions that resolve
//! `f` through the cannon-sys loader on first call:
//!
//! ```ignore
//! pub unsafe fn f(args) -> Result<R, crate::Error> {
//!     type F = unsafe extern "C" fn(arg types) -> R;
//!     static CANNON_SYMBOL: Symbol = Symbol::new(Lib::X, c"f");   // one cache per function
//!     let cannon_addr = CANNON_SYMBOL.get()?;                     // Err: library/symbol missing
//!     let cannon_fn = unsafe { transmute::<*mut c_void, F>(cannon_addr.as_ptr()) };
//!     Ok(unsafe { cannon_fn(args) })
//! }
//! ```
//!
//! Everything else bindgen emits (types, constants, layout assertions) is kept as it is.

use std::collections::BTreeSet;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::{FnArg, ForeignItem, ForeignItemFn, Item, Pat, ReturnType};

use crate::allowlist::ModuleSpec;

/// Marker strings replaced by `// SAFETY:` comments after printing (token streams carry no
/// comments).
pub const SAFETY_TRANSMUTE: &str = "__cannon_safety_transmute__";
pub const SAFETY_CALL: &str = "__cannon_safety_call__";

/// Names the wrapper body uses; a C parameter with one of these names would shadow it.
const RESERVED: &[&str] = &["F", "CANNON_SYMBOL", "cannon_addr", "cannon_fn"];

/// Rewrites every foreign function of `file`; returns the names that were rewritten.
pub fn rewrite(file: &mut syn::File, spec: &ModuleSpec) -> Result<BTreeSet<String>, String> {
    let mut out = Vec::with_capacity(file.items.len());
    let mut done = BTreeSet::new();
    for item in std::mem::take(&mut file.items) {
        let Item::ForeignMod(block) = item else {
            out.push(item);
            continue;
        };
        for foreign in block.items {
            let ForeignItem::Fn(f) = foreign else {
                return Err(format!(
                    "unexpected foreign item (only functions are allowlisted): {}",
                    quote!(#foreign)
                ));
            };
            let name = symbol_name(&f)?;
            let lib = spec
                .lib_of(&name)
                .ok_or_else(|| format!("{name} is not in the allowlist"))?;
            out.push(
                syn::parse2(wrapper(&f, &name, lib.variant(), lib.file())?)
                    .map_err(|e| format!("{name}: {e}"))?,
            );
            done.insert(name);
        }
    }
    file.items = out;
    Ok(done)
}

/// The exported symbol: the Rust name, unless bindgen recorded a different `link_name`.
fn symbol_name(f: &ForeignItemFn) -> Result<String, String> {
    for attr in &f.attrs {
        if attr.path().is_ident("link_name") {
            return Err(format!(
                "{}: bindgen emitted a link_name (C++ mangling?); declare it extern \"C\"",
                f.sig.ident
            ));
        }
    }
    Ok(f.sig.ident.to_string())
}

fn wrapper(
    f: &ForeignItemFn,
    name: &str,
    lib_variant: &str,
    lib_file: &str,
) -> Result<TokenStream, String> {
    if f.sig.variadic.is_some() {
        return Err(format!("{name}: variadic functions are not supported"));
    }
    let ident = &f.sig.ident;
    let mut params = Vec::new();
    let mut arg_names = Vec::new();
    let mut arg_types = Vec::new();
    for input in &f.sig.inputs {
        let FnArg::Typed(pt) = input else {
            return Err(format!("{name}: unexpected receiver"));
        };
        let Pat::Ident(pi) = &*pt.pat else {
            return Err(format!("{name}: unnamed parameter"));
        };
        let (arg, ty) = (&pi.ident, &pt.ty);
        if RESERVED.contains(&arg.to_string().as_str()) {
            return Err(format!(
                "{name}: parameter `{arg}` collides with a wrapper local"
            ));
        }
        params.push(quote!(#arg: #ty));
        arg_names.push(arg.clone());
        arg_types.push(ty.clone());
    }
    let ret = match &f.sig.output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => quote!(#ty),
    };
    let lib = format_ident!("{}", lib_variant);
    let cname = syn::LitCStr::new(
        &std::ffi::CString::new(name).map_err(|e| e.to_string())?,
        Span::call_site(),
    );
    let doc1 = format!(" `{name}`, resolved from {lib_file} on first call.");
    let doc2 =
        " Returns `Err` only when the library or the symbol cannot be found; otherwise the C"
            .to_owned();
    let doc3 = " function's own return value.".to_owned();
    let safety =
        " The caller upholds the C contract of this function (valid pointers, handle".to_owned();
    let safety2 = " lifetimes, thread/context rules; docs/cann-api.md).".to_owned();
    Ok(quote! {
        #[doc = #doc1]
        #[doc = ""]
        #[doc = #doc2]
        #[doc = #doc3]
        #[doc = ""]
        #[doc = " # Safety"]
        #[doc = ""]
        #[doc = #safety]
        #[doc = #safety2]
        pub unsafe fn #ident(#(#params),*) -> ::core::result::Result<#ret, crate::Error> {
            type F = unsafe extern "C" fn(#(#arg_types),*) -> #ret;
            static CANNON_SYMBOL: crate::loader::Symbol =
                crate::loader::Symbol::new(crate::loader::Lib::#lib, #cname);
            let cannon_addr = CANNON_SYMBOL.get()?;
            let _ = #SAFETY_TRANSMUTE;
            let cannon_fn =
                unsafe { ::core::mem::transmute::<*mut ::core::ffi::c_void, F>(cannon_addr.as_ptr()) };
            let _ = #SAFETY_CALL;
            Ok(unsafe { cannon_fn(#(#arg_names),*) })
        }
    })
}

/// Replaces the marker statements by comments in the printed source.
pub fn insert_safety_comments(src: &str) -> Result<String, String> {
    let mut out = String::with_capacity(src.len() + src.len() / 4);
    for line in src.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed == format!("let _ = \"{SAFETY_TRANSMUTE}\";") {
            out.push_str(indent);
            out.push_str(
                "// SAFETY: `cannon_addr` came from dlsym for this symbol; its C type is `F`.\n",
            );
        } else if trimmed == format!("let _ = \"{SAFETY_CALL}\";") {
            out.push_str(indent);
            out.push_str("// SAFETY: the caller upholds the C contract (see `# Safety`).\n");
        } else if line.contains(SAFETY_TRANSMUTE) || line.contains(SAFETY_CALL) {
            return Err(format!("marker printed in an unexpected shape: {line:?}"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}
