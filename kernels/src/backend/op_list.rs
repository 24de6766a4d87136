//! The one list of the ops over runtime buffers, written once.
//!
//! Each entry is an op's signature (after `stream`), its doc, the slice-level function it
//! runs on the CPU, the operands [`super::select`] checks against the stream's device, its
//! `check` run before that, optionally a `meta` value (what it returns on the meta device;
//! default: `Ok` of the return type's default), and its NPU body: a function of the op's
//! `npu.rs` taking the device ordinal, the stream and the entry's arguments in order. Four
//! expansions read it: [`super::Backend`] (one method per entry), its implementations for
//! [`super::Npu`] (each method calls the entry's NPU body) and [`super::Meta`] (each method
//! returns the entry's meta value: the operands were checked, nothing is computed), and
//! [`crate::ops`] (one public entry point per entry, which runs the check, checks the
//! operands' devices and calls the chosen backend's method). A new op is one entry here,
//! its CPU method (`cpu.rs`: borrowing host slices is op-specific) and its NPU body.
//!
//! An entry's `check` holds the op's argument rules (lengths, dims, ids, precision): the
//! `check_*` function of the op's module that its slice-level function and its NPU body call
//! too, so every device enforces one rule, and the meta device, which runs neither, rejects
//! what the CPU would. An op without rules says so (`check {}`); `check(stream)` binds the
//! entry's stream for a rule that depends on the device (attention's statistics layout).

/// Expands `$m! { <every entry> }`.
macro_rules! for_each_op {
    ($m:ident) => {
        $m! {
            /// One AdamW step of `params`, `m`, `v` in place ([`crate::adamw`]).
            fn adamw_step(
                params: &mut BufferViewMut<'_, f32>,
                grads: &BufferView<'_, f32>,
                m: &mut BufferViewMut<'_, f32>,
                v: &mut BufferViewMut<'_, f32>,
                step: u64,
                hp: &AdamW,
            ) -> Result<()>
            => "crate::adamw::host::adamw_step" on [params, grads, m, v]
            check {
                crate::adamw::check_step(params.len(), grads.len(), m.len(), v.len(), step, hp)?;
            }
            npu crate::adamw::npu::step;

            /// Varlen attention forward: writes `out` and `lse` ([`crate::attention`]).
            fn attention_forward<E: Float>(
                a: &VarlenAttention,
                x: QkvBuf<'_, E>,
                out: &mut BufferViewMut<'_, E>,
                lse: &mut BufferViewMut<'_, f32>,
            ) -> Result<()>
            => "crate::attention::host::forward" on [x, out, lse]
            check(stream) {
                let per_head = crate::attention::lse_per_head(stream.device());
                crate::attention::check_forward(a, per_head, x.lens(), out.len(), lse.len())?;
            }
            npu crate::attention::npu::forward;

            /// Varlen attention backward: overwrites dq, dk, dv.
            fn attention_backward<E: Float>(
                a: &VarlenAttention,
                x: QkvBuf<'_, E>,
                out: &BufferView<'_, E>,
                lse: &BufferView<'_, f32>,
                dout: &BufferView<'_, E>,
                g: QkvGradBuf<'_, '_, E>,
            ) -> Result<()>
            => "crate::attention::host::backward" on [x, out, lse, dout, g]
            check(stream) {
                let per_head = crate::attention::lse_per_head(stream.device());
                let saved = (out.len(), lse.len(), dout.len());
                crate::attention::check_backward(a, per_head, x.lens(), saved, g.lens())?;
            }
            npu crate::attention::npu::backward;

            /// Ring attention block forward: merges into the f32 `out` and `lse` accumulators
            /// (`lse` in the device's form: [`crate::attention::block_lse_init`]).
            fn attention_block_forward<E: Float>(
                a: &BlockAttention,
                x: QkvBuf<'_, E>,
                out: &mut BufferViewMut<'_, f32>,
                lse: &mut BufferViewMut<'_, f32>,
            ) -> Result<()>
            => "crate::attention::host::block_forward_merge" on [x, out, lse]
            check(stream) {
                let per_head = crate::attention::lse_per_head(stream.device());
                let (ol, ll) = (out.len(), lse.len());
                crate::attention::check_block_forward(a, per_head, x.lens(), ol, ll)?;
            }
            npu crate::attention::npu::block_forward;

            /// Ring attention block backward: adds into the f32 dq, dk, dv accumulators.
            fn attention_block_backward<E: Float>(
                a: &BlockAttention,
                x: QkvBuf<'_, E>,
                out: &BufferView<'_, E>,
                lse: &BufferView<'_, f32>,
                dout: &BufferView<'_, E>,
                g: QkvGradBuf<'_, '_, f32>,
            ) -> Result<()>
            => "crate::attention::host::block_backward_accumulate" on [x, out, lse, dout, g]
            check(stream) {
                let per_head = crate::attention::lse_per_head(stream.device());
                let saved = (out.len(), lse.len(), dout.len());
                crate::attention::check_block_backward(a, per_head, x.lens(), saved, g.lens())?;
            }
            npu crate::attention::npu::block_backward;

            /// `dst = src` converted between storage types ([`crate::cast`]).
            fn cast<A: Float, B: Float>(
                src: &BufferView<'_, A>,
                dst: &mut BufferViewMut<'_, B>,
            ) -> Result<()>
            => "crate::cast::host::cast" on [src, dst]
            check { crate::cast::check_cast(src.len(), dst.len())?; }
            npu crate::cast::npu::convert;

            /// Cross-entropy of `[N, V]` logits; writes `d_logits` when given.
            fn cross_entropy(
                logits: &BufferView<'_, f32>,
                labels: &[i32],
                vocab: usize,
                d_logits: Option<&mut BufferViewMut<'_, f32>>,
                norm: LossNorm,
            ) -> Result<CeStats>
            => "crate::cross_entropy::host::cross_entropy" on [logits, d_logits]
            check {
                let (n, d) = (logits.len(), d_logits.as_ref().map(|d| d.len()));
                crate::cross_entropy::check_full("cross_entropy", labels, vocab, n, d, norm)?;
            }
            meta { Ok(CeStats::of_labels(labels)) }
            npu crate::cross_entropy::npu::full;

            /// Cross-entropy whose gradient overwrites the logits.
            fn cross_entropy_in_place(
                logits: &mut BufferViewMut<'_, f32>,
                labels: &[i32],
                vocab: usize,
                norm: LossNorm,
            ) -> Result<CeStats>
            => "crate::cross_entropy::host::cross_entropy_in_place" on [logits]
            check {
                let (op, n) = ("cross_entropy_in_place", logits.len());
                crate::cross_entropy::check_full(op, labels, vocab, n, None, norm)?;
            }
            meta { Ok(CeStats::of_labels(labels)) }
            npu crate::cross_entropy::npu::in_place;

            /// Cross-entropy of the lm_head logits `h w^T`, `chunk_rows` rows at a time.
            fn cross_entropy_lm_head(
                h: &BufferView<'_, f32>,
                w: &BufferView<'_, f32>,
                labels: &[i32],
                d_model: usize,
                vocab: usize,
                chunk_rows: usize,
                norm: LossNorm,
                grads: LmHeadGrads<'_>,
            ) -> Result<CeStats>
            => "crate::cross_entropy::host::cross_entropy_chunked" on [h, w, grads]
            check {
                grads.check(h.len(), w.len(), labels.len(), d_model, vocab)?;
                crate::cross_entropy::check_chunked(labels, vocab, chunk_rows, norm)?;
            }
            meta { Ok(CeStats::of_labels(labels)) }
            npu crate::cross_entropy::npu::chunked_lm_head;

            /// Gathers rows `ids` of `weight` ([`crate::embedding`]).
            fn embedding_forward<E: Float>(
                out: &mut BufferViewMut<'_, E>,
                ids: &[u32],
                weight: &BufferView<'_, E>,
                dim: usize,
            ) -> Result<()>
            => "crate::embedding::host::embedding_forward" on [out, weight]
            check { crate::embedding::check_forward(out.len(), ids, weight.len(), dim)?; }
            npu crate::embedding::npu::forward;

            /// `dweight[ids[t]] += dout[t]`.
            fn embedding_backward<E: Float>(
                dweight: &mut BufferViewMut<'_, f32>,
                dout: &BufferView<'_, E>,
                ids: &[u32],
                dim: usize,
            ) -> Result<()>
            => "crate::embedding::host::embedding_backward" on [dweight, dout]
            check { crate::embedding::check_backward(dweight.len(), dout.len(), ids, dim)?; }
            npu crate::embedding::npu::backward;

            /// `y = gelu(x)` ([`crate::gelu`]).
            fn gelu_forward<E: Float>(
                y: &mut BufferViewMut<'_, E>,
                x: &BufferView<'_, E>,
            ) -> Result<()>
            => "crate::gelu::host::gelu_forward" on [y, x]
            check { crate::gelu::check_forward(y.len(), x.len())?; }
            npu crate::gelu::npu::forward;

            /// `dx += dy * gelu'(x)`.
            fn gelu_backward<E: Float>(
                dx: &mut BufferViewMut<'_, E>,
                dy: &BufferView<'_, E>,
                x: &BufferView<'_, E>,
            ) -> Result<()>
            => "crate::gelu::host::gelu_backward" on [dx, dy, x]
            check { crate::gelu::check_backward(dx.len(), dy.len(), x.len())?; }
            npu crate::gelu::npu::backward;

            /// `C = alpha op(A) op(B) + beta C` in precision `p` ([`crate::gemm`]).
            fn gemm<A: Float, B: Float>(
                p: Precision,
                ta: Trans,
                tb: Trans,
                d: Dims,
                alpha: f32,
                a: &BufferView<'_, A>,
                lda: usize,
                b: &BufferView<'_, B>,
                ldb: usize,
                beta: f32,
                c: &mut BufferViewMut<'_, f32>,
                ldc: usize,
            ) -> Result<()>
            => "crate::gemm::host::gemm_f32" on [a, b, c]
            check {
                let (al, bl, cl) = ((a.len(), lda), (b.len(), ldb), (c.len(), ldc));
                crate::gemm::check_gemm::<A, B>(p, (ta, tb), d, al, bl, cl)?;
            }
            npu crate::gemm::npu::gemm;

            /// Sum of squares of every element of every view, in f64 ([`crate::grad_clip`]).
            fn grad_sum_squares(
                grads: &[BufferView<'_, f32>],
            ) -> Result<f64>
            => "crate::grad_clip::host::grad_sum_squares" on [grads]
            check {} // any views, any lengths
            npu crate::grad_clip::npu::grad_sum_squares;

            /// Every element of every view times `coef`.
            fn scale_grads(
                grads: &mut [BufferViewMut<'_, f32>],
                coef: f32,
            ) -> Result<()>
            => "crate::grad_clip::host::scale_grads" on [grads]
            check {} // any views, any lengths
            npu crate::grad_clip::npu::scale_grads;

            /// `y = x w^T (+ b)` in precision `p` ([`crate::linear`]).
            fn linear_forward<Y: Float, X: Float, W: Float>(
                p: Precision,
                y: &mut BufferViewMut<'_, Y>,
                x: &BufferView<'_, X>,
                w: &BufferView<'_, W>,
                b: Option<&BufferView<'_, W>>,
                d: LinearDims,
            ) -> Result<()>
            => "crate::linear::host::linear_forward" on [y, x, w, b]
            check {
                let bl = b.map(|b| b.len());
                crate::linear::check_forward::<Y, X, W>(p, d, y.len(), x.len(), w.len(), bl)?;
            }
            npu crate::linear::npu::forward;

            /// Accumulates the gradients present in `g`, in precision `p`.
            fn linear_backward<G: Float, X: Float, W: Float>(
                p: Precision,
                g: LinearGradBufs<'_>,
                dy: &BufferView<'_, G>,
                x: &BufferView<'_, X>,
                w: &BufferView<'_, W>,
                d: LinearDims,
            ) -> Result<()>
            => "crate::linear::host::linear_backward" on [g, dy, x, w]
            check {
                let (dyl, xl, wl) = (dy.len(), x.len(), w.len());
                crate::linear::check_backward::<G, X, W>(p, d, g.lens(), dyl, xl, wl)?;
            }
            npu crate::linear::npu::backward;

            /// `out = im2col(pixels) weight^T` in precision `p` ([`crate::patch_embed`]).
            fn patch_embed_forward<P: Float, W: Float>(
                p: Precision,
                out: &mut BufferViewMut<'_, f32>,
                pixels: &BufferView<'_, P>,
                weight: &BufferView<'_, W>,
                g: PatchGeom,
                d_model: usize,
            ) -> Result<()>
            => "crate::patch_embed::host::patch_embed_forward" on [out, pixels, weight]
            check {
                let (ol, pl, wl) = (out.len(), pixels.len(), weight.len());
                crate::patch_embed::check_forward::<P, W>(p, &g, d_model, ol, pl, wl)?;
            }
            npu crate::patch_embed::npu::forward;

            /// Accumulates the gradients present in `grads`, in precision `p`.
            fn patch_embed_backward<G: Float, P: Float, W: Float>(
                p: Precision,
                grads: PatchEmbedGradBufs<'_>,
                dout: &BufferView<'_, G>,
                pixels: &BufferView<'_, P>,
                weight: &BufferView<'_, W>,
                g: PatchGeom,
                d_model: usize,
            ) -> Result<()>
            => "crate::patch_embed::host::patch_embed_backward" on [grads, dout, pixels, weight]
            check {
                let (gl, dl) = (grads.lens(), dout.len());
                let (pl, wl) = (pixels.len(), weight.len());
                crate::patch_embed::check_backward::<G, P, W>(p, &g, d_model, gl, dl, pl, wl)?;
            }
            npu crate::patch_embed::npu::backward;

            /// `out = rmsnorm(x) * weight`, saving `rstd` ([`crate::rmsnorm`]).
            fn rmsnorm_forward<E: Float>(
                out: &mut BufferViewMut<'_, E>,
                rstd: &mut BufferViewMut<'_, f32>,
                x: &BufferView<'_, E>,
                weight: &BufferView<'_, E>,
                dim: usize,
                eps: f32,
            ) -> Result<()>
            => "crate::rmsnorm::host::rmsnorm_forward" on [out, rstd, x, weight]
            check {
                crate::rmsnorm::check_forward(out.len(), rstd.len(), x.len(), weight.len(), dim)?;
            }
            npu crate::rmsnorm::npu::forward;

            /// Accumulates `dx` and `dweight`.
            fn rmsnorm_backward<E: Float>(
                dx: &mut BufferViewMut<'_, E>,
                dweight: &mut BufferViewMut<'_, f32>,
                dout: &BufferView<'_, E>,
                x: &BufferView<'_, E>,
                weight: &BufferView<'_, E>,
                rstd: &BufferView<'_, f32>,
                dim: usize,
            ) -> Result<()>
            => "crate::rmsnorm::host::rmsnorm_backward" on [dx, dweight, dout, x, weight, rstd]
            check {
                let (dxl, dwl, dl) = (dx.len(), dweight.len(), dout.len());
                let (xl, wl, rl) = (x.len(), weight.len(), rstd.len());
                crate::rmsnorm::check_backward(dxl, dwl, dl, xl, wl, rl, dim)?;
            }
            npu crate::rmsnorm::npu::backward;

            /// Rotates `x` in place by the angles of `pos` ([`crate::rope`]).
            fn rope_forward<E: Float>(
                x: &mut BufferViewMut<'_, E>,
                n_heads: usize,
                table: &RopeTable,
                pos: &[u32],
            ) -> Result<()>
            => "crate::rope::host::rope_forward" on [x]
            check {
                crate::rope::check_apply_len("rope_forward", x.len(), n_heads, table, pos)?;
            }
            npu crate::rope::npu::forward;

            /// The inverse rotation of `dx`, in place.
            fn rope_backward<E: Float>(
                dx: &mut BufferViewMut<'_, E>,
                n_heads: usize,
                table: &RopeTable,
                pos: &[u32],
            ) -> Result<()>
            => "crate::rope::host::rope_backward" on [dx]
            check {
                crate::rope::check_apply_len("rope_backward", dx.len(), n_heads, table, pos)?;
            }
            npu crate::rope::npu::backward;

            /// `h = silu(gate) * up` ([`crate::swiglu`]).
            fn swiglu_forward<E: Float>(
                h: &mut BufferViewMut<'_, E>,
                gate: &BufferView<'_, E>,
                up: &BufferView<'_, E>,
            ) -> Result<()>
            => "crate::swiglu::host::swiglu_forward" on [h, gate, up]
            check { crate::swiglu::check_forward(h.len(), gate.len(), up.len())?; }
            npu crate::swiglu::npu::forward;

            /// Accumulates `d_gate` and `d_up`.
            fn swiglu_backward<E: Float>(
                d_gate: &mut BufferViewMut<'_, E>,
                d_up: &mut BufferViewMut<'_, E>,
                dh: &BufferView<'_, E>,
                gate: &BufferView<'_, E>,
                up: &BufferView<'_, E>,
            ) -> Result<()>
            => "crate::swiglu::host::swiglu_backward" on [d_gate, d_up, dh, gate, up]
            check {
                let (dg, du, dh) = (d_gate.len(), d_up.len(), dh.len());
                crate::swiglu::check_backward(dg, du, dh, gate.len(), up.len())?;
            }
            npu crate::swiglu::npu::backward;

            /// `y += x` ([`crate::elementwise`]).
            fn add_into<E: Float>(
                y: &mut BufferViewMut<'_, E>,
                x: &BufferView<'_, E>,
            ) -> Result<()>
            => "crate::elementwise::host::add_into" on [y, x]
            check { crate::elementwise::check_add_into(y.len(), x.len())?; }
            npu crate::elementwise::npu::add_into;

            /// `out = a * b`.
            fn mul<E: Float>(
                out: &mut BufferViewMut<'_, E>,
                a: &BufferView<'_, E>,
                b: &BufferView<'_, E>,
            ) -> Result<()>
            => "crate::elementwise::host::mul" on [out, a, b]
            check { crate::elementwise::check_mul(out.len(), a.len(), b.len())?; }
            npu crate::elementwise::npu::mul;

            /// `y *= x`.
            fn mul_into<E: Float>(
                y: &mut BufferViewMut<'_, E>,
                x: &BufferView<'_, E>,
            ) -> Result<()>
            => "crate::elementwise::host::mul_into" on [y, x]
            check { crate::elementwise::check_mul_into(y.len(), x.len())?; }
            npu crate::elementwise::npu::mul_into;

            /// `out[i] = src[idx[i]]`, rows of `dim` ([`crate::index`]).
            fn gather_rows<T: Element>(
                out: &mut BufferViewMut<'_, T>,
                src: &BufferView<'_, T>,
                idx: &[usize],
                dim: usize,
            ) -> Result<()>
            => "crate::index::host::gather_rows" on [out, src]
            check { crate::index::check_gather_rows(out.len(), src.len(), idx, dim)?; }
            npu crate::index::npu::gather_rows;

            /// `dst[idx[i]] = src[i]`.
            fn scatter_rows<T: Element>(
                dst: &mut BufferViewMut<'_, T>,
                src: &BufferView<'_, T>,
                idx: &[usize],
                dim: usize,
            ) -> Result<()>
            => "crate::index::host::scatter_rows" on [dst, src]
            check {
                crate::index::check_scatter_rows("scatter_rows", dst.len(), src.len(), idx, dim)?;
            }
            npu crate::index::npu::scatter_rows;

            /// `dst[idx[i]] += src[i]`, in order of i.
            fn scatter_add_rows<E: Float>(
                dst: &mut BufferViewMut<'_, E>,
                src: &BufferView<'_, E>,
                idx: &[usize],
                dim: usize,
            ) -> Result<()>
            => "crate::index::host::scatter_add_rows" on [dst, src]
            check {
                let (op, n, m) = ("scatter_add_rows", dst.len(), src.len());
                crate::index::check_scatter_rows(op, n, m, idx, dim)?;
            }
            npu crate::index::npu::scatter_add_rows;

            /// `dst[idx[i]] = 0`.
            fn zero_rows<T: Element>(
                dst: &mut BufferViewMut<'_, T>,
                idx: &[usize],
                dim: usize,
            ) -> Result<()>
            => "crate::index::host::zero_rows" on [dst]
            check { crate::index::check_zero_rows(dst.len(), idx, dim)?; }
            npu crate::index::npu::zero_rows;

            /// `out[b, c, r] = x[b, r, c]`.
            fn transpose<T: Element>(
                out: &mut BufferViewMut<'_, T>,
                x: &BufferView<'_, T>,
                d: TransposeDims,
            ) -> Result<()>
            => "crate::index::host::transpose" on [out, x]
            check { crate::index::check_transpose(out.len(), x.len(), d)?; }
            npu crate::index::npu::transpose;
        }
    };
}
pub(crate) use for_each_op;

/// [`super::Backend`] from the op list.
macro_rules! declare_backend {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident $(<$($g:ident: $bound:ident),*>)? ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
        => $slice:literal on [$($on:ident),*]
        check $(($st:ident))? $check:block $(meta $meta:block)?
        npu $npu:path;
    )*) => {
        /// Every op of the crate over runtime buffers, as one backend runs it. Shapes,
        /// conventions and errors are those of the slice-level op (see each op's module);
        /// `stream` orders the work on the backend's device.
        pub trait Backend {
            $(
                $(#[doc = $doc])*
                #[allow(clippy::too_many_arguments)]
                fn $name $(<$($g: $bound),*>)? (
                    &self,
                    stream: &cannon_runtime::Stream,
                    $($arg: $ty),*
                ) -> $ret;
            )*
        }
    };
}
pub(crate) use declare_backend;

/// The public entry points of [`crate::ops`] from the op list: each runs its `check`, picks
/// the backend from the stream and its operands, and calls that backend's method.
macro_rules! define_entry_points {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident $(<$($g:ident: $bound:ident),*>)? ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
        => $slice:literal on [$($on:ident),*]
        check $(($st:ident))? $check:block $(meta $meta:block)?
        npu $npu:path;
    )*) => {
        $(
            #[doc = concat!("[`", $slice, "`] on `stream`'s device:")]
            $(#[doc = $doc])*
            #[allow(clippy::too_many_arguments)]
            pub fn $name $(<$($g: $bound),*>)? (
                stream: &cannon_runtime::Stream,
                $($arg: $ty),*
            ) -> $ret {
                // `check(name)` binds the stream under a name of the op list's own: its
                // tokens do not see this macro's `stream` (hygiene).
                $(let $st: &cannon_runtime::Stream = stream;)?
                $check
                $crate::backend::dispatch!(stringify!($name), stream, [$($on),*], |be| {
                    $crate::backend::Backend::$name(&be, stream, $($arg),*)
                })
            }
        )*
    };
}
pub(crate) use define_entry_points;

/// `impl Backend for Npu` from the op list: each method is the entry's NPU body.
macro_rules! impl_npu_backend {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident $(<$($g:ident: $bound:ident),*>)? ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
        => $slice:literal on [$($on:ident),*]
        check $(($st:ident))? $check:block $(meta $meta:block)?
        npu $npu:path;
    )*) => {
        impl Backend for Npu {
            $(
                #[allow(clippy::too_many_arguments)]
                fn $name $(<$($g: $bound),*>)? (
                    &self,
                    stream: &cannon_runtime::Stream,
                    $($arg: $ty),*
                ) -> $ret {
                    $npu(self.ordinal, stream, $($arg),*)
                }
            )*
        }
    };
}
pub(crate) use impl_npu_backend;

/// `impl Backend for Meta` from the op list: every method returns the entry's meta value
/// (default: `Ok` of the default of the return type) without touching its operands, which
/// the dispatch checked (every one on the meta device) and which have no storage.
macro_rules! impl_meta_backend {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident $(<$($g:ident: $bound:ident),*>)? ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
        => $slice:literal on [$($on:ident),*]
        check $(($st:ident))? $check:block $(meta $meta:block)?
        npu $npu:path;
    )*) => {
        impl Backend for Meta {
            $(
                #[allow(clippy::too_many_arguments, unused_variables)]
                fn $name $(<$($g: $bound),*>)? (
                    &self,
                    stream: &cannon_runtime::Stream,
                    $($arg: $ty),*
                ) -> $ret {
                    $crate::backend::meta::value!($($meta)?)
                }
            )*
        }
    };
}
pub(crate) use impl_meta_backend;
