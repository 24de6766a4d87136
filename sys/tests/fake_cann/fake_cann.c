/*
 * Stand-ins for the CANN libraries, so the loader and the generated wrappers can be exercised
 * on a machine without CANN. Compiled once per library by tests/fake_cann.rs with one of
 * -DFAKE_ACL, -DFAKE_NNOPBASE, -DFAKE_OPAPI_MATH, -DFAKE_OPAPI, -DFAKE_HCCL. Each function
 * reports what it received so the tests can check argument order and ABI, not just linkage.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef FAKE_ACL
/* libascendcl.so. aclrtMalloc is deliberately absent (SymbolNotFound test). */
int aclrtGetDeviceCount(uint32_t *count) {
    *count = 3;
    return 0;
}
int aclrtGetVersion(int32_t *major, int32_t *minor, int32_t *patch) {
    *major = 1;
    *minor = 17;
    *patch = 4;
    return 0;
}
/* Copies host->host like the real call; rejects other kinds or count > destMax with
 * ACL_ERROR_INVALID_PARAM, so a swapped destMax/count or kind shows in the result. */
int aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind) {
    if (kind != 0 || count > destMax) return 100000;
    memcpy(dst, src, count);
    return 0;
}
const char *aclGetRecentErrMsg(void) { return "fake acl: last error"; }
#endif

#ifdef FAKE_NNOPBASE
/* libnnopbase.so: aclCreateTensor returns a record of its arguments in slot order. */
typedef struct {
    const int64_t *viewDims;
    uint64_t viewDimsNum;
    int32_t dataType;
    const int64_t *stride;
    int64_t offset;
    int32_t format;
    const int64_t *storageDims;
    uint64_t storageDimsNum;
    void *tensorData;
} FakeTensor;
static FakeTensor last_tensor;
void *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, int32_t dataType,
                      const int64_t *stride, int64_t offset, int32_t format,
                      const int64_t *storageDims, uint64_t storageDimsNum, void *tensorData) {
    FakeTensor t = {viewDims, viewDimsNum, dataType, stride, offset,
                    format, storageDims, storageDimsNum, tensorData};
    last_tensor = t;
    return &last_tensor;
}
/* 0 for the tensor this library made, ACLNN_ERR_PARAM_NULLPTR/INVALID otherwise. */
int32_t aclDestroyTensor(const void *t) {
    if (t == NULL) return 161001;
    return t == &last_tensor ? 0 : 161002;
}
#endif

#ifdef FAKE_OPAPI_MATH
/* libopapi_math.so: found before libopapi.so (torch_npu order), so its Mul wins. */
int32_t aclnnMulGetWorkspaceSize(const void *self, const void *other, void *out,
                                 uint64_t *workspaceSize, void **executor) {
    (void)self; (void)other; (void)out;
    *workspaceSize = 111;
    *executor = NULL;
    return 0;
}
#endif

#ifdef FAKE_OPAPI
/* libopapi.so: a shadowed Mul and the only Matmul. */
int32_t aclnnMulGetWorkspaceSize(const void *self, const void *other, void *out,
                                 uint64_t *workspaceSize, void **executor) {
    (void)self; (void)other; (void)out;
    *workspaceSize = 222;
    *executor = NULL;
    return 0;
}
int32_t aclnnMatmulGetWorkspaceSize(const void *self, const void *mat2, void *out,
                                    int8_t cubeMathType, uint64_t *workspaceSize,
                                    void **executor) {
    (void)self; (void)mat2; (void)out;
    *workspaceSize = 1000 + (uint64_t)cubeMathType;
    *executor = NULL;
    return 0;
}
#endif

#ifdef FAKE_HCCL
/* libhccl.so */
const char *HcclGetErrorString(unsigned code) { return code == 1 ? "fake: E_PARA" : "fake: other"; }
unsigned HcclGetRankSize(void *comm, uint32_t *rankSize) {
    if (comm == NULL) return 2; /* HCCL_E_PTR */
    *rankSize = 8;
    return 0;
}
#endif
