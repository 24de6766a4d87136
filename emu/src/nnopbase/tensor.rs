//! The aclTensor descriptor: what `aclCreateTensor` was given, validated, and the host access
//! op handlers use inside their stream jobs.

use crate::error::{EmuError, EmuResult};
use cannon_sys::acl::*;
use std::sync::atomic::{AtomicUsize, Ordering};

pub const PARAM_NULLPTR: i32 = 161001;
pub const PARAM_INVALID: i32 = 161002;

/// Element size in bytes of the data types the emulator knows (every aclDataType CANN's ops
/// take for our model: floats, integers, bool); `None` for an unknown or sub-byte code.
pub fn dtype_size(dt: aclDataType) -> Option<usize> {
    Some(match dt {
        ACL_FLOAT | ACL_INT32 | ACL_UINT32 => 4,
        ACL_FLOAT16 | ACL_BF16 | ACL_INT16 | ACL_UINT16 => 2,
        ACL_INT8 | ACL_UINT8 | ACL_BOOL | ACL_HIFLOAT8 | ACL_FLOAT8_E5M2 | ACL_FLOAT8_E4M3FN
        | ACL_FLOAT8_E8M0 => 1,
        ACL_INT64 | ACL_UINT64 | ACL_DOUBLE | ACL_COMPLEX64 => 8,
        ACL_COMPLEX128 => 16,
        ACL_COMPLEX32 => 4,
        _ => return None,
    })
}

/// The name of a data type, for messages.
pub fn dtype_name(dt: aclDataType) -> String {
    match dt {
        ACL_FLOAT => "FLOAT".into(),
        ACL_FLOAT16 => "FLOAT16".into(),
        ACL_BF16 => "BFLOAT16".into(),
        ACL_INT8 => "INT8".into(),
        ACL_INT32 => "INT32".into(),
        ACL_INT64 => "INT64".into(),
        ACL_UINT8 => "UINT8".into(),
        ACL_BOOL => "BOOL".into(),
        ACL_DOUBLE => "DOUBLE".into(),
        other => format!("aclDataType {other}"),
    }
}

/// aclFormat values `aclCreateTensor` accepts (the enumerators of acl_base_rt.h).
pub fn format_known(f: aclFormat) -> bool {
    matches!(
        f,
        ACL_FORMAT_NCHW
            | ACL_FORMAT_NHWC
            | ACL_FORMAT_ND
            | ACL_FORMAT_NC1HWC0
            | ACL_FORMAT_FRACTAL_Z
            | ACL_FORMAT_NC1HWC0_C04
            | ACL_FORMAT_HWCN
            | ACL_FORMAT_NDHWC
            | ACL_FORMAT_FRACTAL_NZ
            | ACL_FORMAT_NCDHW
            | ACL_FORMAT_NDC1HWC0
            | ACL_FRACTAL_Z_3D
            | ACL_FORMAT_NC
            | ACL_FORMAT_NCL
    )
}

/// One aclTensor: the view over the storage, and the (re-bindable) data address.
#[derive(Debug)]
pub struct TensorDesc {
    pub dims: Vec<i64>,
    pub strides: Vec<i64>,
    /// Elements from `data` to the view's first element.
    pub offset: i64,
    pub format: aclFormat,
    pub dtype: aclDataType,
    pub storage_dims: Vec<i64>,
    /// `aclSetRawTensorAddr` rebinds it (executor reuse), hence atomic.
    pub data: AtomicUsize,
}

impl TensorDesc {
    /// Validates `aclCreateTensor`'s arguments (everything but the host pointers, which the
    /// caller already read).
    pub fn new(
        dims: Vec<i64>,
        strides: Vec<i64>,
        offset: i64,
        format: aclFormat,
        dtype: aclDataType,
        storage_dims: Vec<i64>,
        data: usize,
    ) -> EmuResult<Self> {
        let bad = |m: String| Err(EmuError::new(PARAM_INVALID, m));
        let Some(es) = dtype_size(dtype) else {
            return bad(format!("dataType {dtype} is not a known aclDataType"));
        };
        if !format_known(format) {
            return bad(format!(
                "format {format} is not a known aclFormat (is the offset in the format slot? offset is the 5th argument, format the 6th)"
            ));
        }
        if let Some(d) = dims.iter().find(|&&d| d < 0) {
            return bad(format!("view dims {dims:?}: dimension {d} is negative"));
        }
        if let Some(s) = strides.iter().find(|&&s| s < 0) {
            return bad(format!("strides {strides:?}: stride {s} is negative"));
        }
        if offset < 0 {
            return bad(format!("offset {offset} is negative"));
        }
        if storage_dims.iter().any(|&d| d < 0) {
            return bad(format!(
                "storage dims {storage_dims:?} hold a negative dimension"
            ));
        }
        let t = TensorDesc {
            dims,
            strides,
            offset,
            format,
            dtype,
            storage_dims,
            data: AtomicUsize::new(data),
        };
        let numel = t.numel();
        // The view (offset + furthest element) must lie inside the storage.
        let storage: i64 = t.storage_dims.iter().product();
        if numel > 0 && t.extent() as i64 > storage {
            return bad(format!(
                "the view (dims {:?}, strides {:?}, offset {}) reaches element {} but the storage dims {:?} hold {storage}",
                t.dims,
                t.strides,
                t.offset,
                t.extent() - 1,
                t.storage_dims
            ));
        }
        if data == 0 {
            if numel > 0 {
                return Err(EmuError::new(
                    PARAM_NULLPTR,
                    format!("tensorData is null for a tensor of {numel} elements"),
                ));
            }
        } else {
            crate::mem::owner(data)
                .map_err(|e| EmuError::new(PARAM_INVALID, format!("tensorData: {}", e.message)))?;
            // The whole storage must be device memory of one live allocation.
            let bytes = (storage.max(1) as usize) * es;
            crate::mem::resolve(data, bytes).map_err(|e| {
                EmuError::new(
                    PARAM_INVALID,
                    format!("tensorData's storage of {bytes} bytes: {}", e.message),
                )
            })?;
        }
        Ok(t)
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }

    pub fn elem_size(&self) -> usize {
        dtype_size(self.dtype).unwrap_or(1)
    }

    /// One past the furthest element the view touches, counted from `data` (0 when empty).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        let far: i64 = self
            .dims
            .iter()
            .zip(&self.strides)
            .map(|(&d, &s)| (d - 1) * s)
            .sum();
        (self.offset + far + 1) as usize
    }

    /// True when the view is row-major contiguous (size-1 dims' strides do not matter).
    pub fn is_contiguous(&self) -> bool {
        let mut want = 1i64;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            if d != 1 && s != want {
                return false;
            }
            want *= d;
        }
        true
    }

    pub fn addr(&self) -> usize {
        self.data.load(Ordering::SeqCst)
    }

    /// The device address of the view's first element.
    pub fn first_elem_addr(&self) -> usize {
        self.addr() + self.offset as usize * self.elem_size()
    }
}
