/*
 * The aclnn declarations cannon binds: the descriptor API of libnnopbase.so and the ops we call
 * (two-phase: aclnnXxxGetWorkspaceSize + aclnnXxx). The aclnn/aclnnop headers are not in the
 * torch_npu wheel, so this file restates the documented signatures (types and argument order)
 * from docs/cann-api.md §2-4, which cross-checked them against the CANN 8.1.RC1 headers and the
 * open-source ops-nn / ops-math / ops-transformer repositories.
 *
 * aclDataType, aclFormat and aclrtStream come from the wheel's acl/acl_base_rt.h, so the same
 * generated types are shared with the runtime bindings.
 */
#ifndef CANNON_ACLNN_H_
#define CANNON_ACLNN_H_

#include <stdbool.h>
#include <stdint.h>

#include "acl/acl_base_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- descriptors (aclnn/acl_meta.h, aclnn/aclnn_base.h; libnnopbase.so) ---- */

typedef struct aclOpExecutor aclOpExecutor;
typedef struct aclTensor aclTensor;
typedef struct aclScalar aclScalar;
typedef struct aclIntArray aclIntArray;
typedef struct aclFloatArray aclFloatArray;
typedef struct aclBoolArray aclBoolArray;
typedef struct aclTensorList aclTensorList;
typedef struct aclScalarList aclScalarList;
typedef int32_t aclnnStatus;

/* offset (5th) counts elements; format is the 6th argument. */
aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
                           const int64_t *stride, int64_t offset, aclFormat format,
                           const int64_t *storageDims, uint64_t storageDimsNum, void *tensorData);
aclScalar *aclCreateScalar(void *value, aclDataType dataType);
aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size);
aclFloatArray *aclCreateFloatArray(const float *value, uint64_t size);
aclBoolArray *aclCreateBoolArray(const bool *value, uint64_t size);
aclTensorList *aclCreateTensorList(const aclTensor *const *value, uint64_t size);
aclScalarList *aclCreateScalarList(const aclScalar *const *value, uint64_t size);

aclnnStatus aclDestroyTensor(const aclTensor *tensor);
aclnnStatus aclDestroyScalar(const aclScalar *scalar);
aclnnStatus aclDestroyIntArray(const aclIntArray *array);
aclnnStatus aclDestroyFloatArray(const aclFloatArray *array);
aclnnStatus aclDestroyBoolArray(const aclBoolArray *array);
aclnnStatus aclDestroyTensorList(const aclTensorList *array);
aclnnStatus aclDestroyScalarList(const aclScalarList *array);

aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor);
aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor);
aclnnStatus aclSetRawTensorAddr(aclTensor *tensor, void *addr);
aclnnStatus aclGetRawTensorAddr(const aclTensor *tensor, void **addr);

aclnnStatus aclnnInit(const char *configPath);
aclnnStatus aclnnFinalize(void);

/* ---- ops (aclnnop/aclnn_*.h; libopapi.so or split libopapi_*.so) ---- */

/* Phase 2 of every op has this shape. */
#define CANNON_ACLNN_PHASE2(name)                                                                   \
    aclnnStatus name(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,            \
                     aclrtStream stream)

/* Fused attention, varlen TND layout (aclnn_flash_attention_score.h). */
aclnnStatus aclnnFlashAttentionVarLenScoreGetWorkspaceSize(
    const aclTensor *query, const aclTensor *key, const aclTensor *value,
    const aclTensor *realShiftOptional, const aclTensor *dropMaskOptional,
    const aclTensor *paddingMaskOptional, const aclTensor *attenMaskOptional,
    const aclIntArray *prefixOptional, const aclIntArray *actualSeqQLenOptional,
    const aclIntArray *actualSeqKvLenOptional, double scaleValue, double keepProb,
    int64_t preTokens, int64_t nextTokens, int64_t headNum, char *inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor *softmaxMaxOut,
    const aclTensor *softmaxSumOut, const aclTensor *softmaxOutOut,
    const aclTensor *attentionOutOut, uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnFlashAttentionVarLenScore);

/* Its backward (aclnn_flash_attention_score_grad.h). */
aclnnStatus aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize(
    const aclTensor *query, const aclTensor *keyIn, const aclTensor *value, const aclTensor *dy,
    const aclTensor *pseShiftOptional, const aclTensor *dropMaskOptional,
    const aclTensor *paddingMaskOptional, const aclTensor *attenMaskOptional,
    const aclTensor *softmaxMaxOptional, const aclTensor *softmaxSumOptional,
    const aclTensor *softmaxInOptional, const aclTensor *attentionInOptional,
    const aclIntArray *prefixOptional, const aclIntArray *actualSeqQLenOptional,
    const aclIntArray *actualSeqKvLenOptional, double scaleValue, double keepProb,
    int64_t preTokens, int64_t nextTokens, int64_t headNum, char *inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor *dqOut, const aclTensor *dkOut,
    const aclTensor *dvOut, const aclTensor *dpseOut, uint64_t *workspaceSize,
    aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnFlashAttentionUnpaddingScoreGrad);

/* Merges two FlashAttention results by their softmax max and sum, for ring attention
 * (aclnn_ring_attention_update.h; ops-transformer attention/ring_attention_update docs:
 * inputLayout "SBH" or "TND", softmax statistics [B, N, S, 8] or [T, N, 8] FLOAT, attention
 * outputs of one dtype; actualSeqQlenOptional, an INT64 tensor, only for TND). */
aclnnStatus aclnnRingAttentionUpdateGetWorkspaceSize(
    const aclTensor *prevAttnOut, const aclTensor *prevSoftmaxMax,
    const aclTensor *prevSoftmaxSum, const aclTensor *curAttnOut, const aclTensor *curSoftmaxMax,
    const aclTensor *curSoftmaxSum, const aclTensor *actualSeqQlenOptional,
    char *inputLayoutOptional, const aclTensor *attnOutOut, const aclTensor *softmaxMaxOut,
    const aclTensor *softmaxSumOut, uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnRingAttentionUpdate);

/* Matmul with broadcasting batch dims (aclnn_matmul.h) and the 2-D Mm (aclnn_mm.h). */
aclnnStatus aclnnMatmulGetWorkspaceSize(const aclTensor *self, const aclTensor *mat2,
                                        aclTensor *out, int8_t cubeMathType,
                                        uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnMatmul);
aclnnStatus aclnnMmGetWorkspaceSize(const aclTensor *self, const aclTensor *mat2, aclTensor *out,
                                    int8_t cubeMathType, uint64_t *workspaceSize,
                                    aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnMm);

/* RMSNorm forward/backward (aclnn_rms_norm.h, aclnn_rms_norm_grad.h). */
aclnnStatus aclnnRmsNormGetWorkspaceSize(const aclTensor *x, const aclTensor *gamma,
                                         double epsilon, const aclTensor *yOut,
                                         const aclTensor *rstdOut, uint64_t *workspaceSize,
                                         aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnRmsNorm);
aclnnStatus aclnnRmsNormGradGetWorkspaceSize(const aclTensor *dy, const aclTensor *x,
                                             const aclTensor *rstd, const aclTensor *gamma,
                                             const aclTensor *dxOut, const aclTensor *dgammaOut,
                                             uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnRmsNormGrad);

/* SwiGLU forward/backward (aclnn_swi_glu.h, aclnn_swi_glu_grad.h). */
aclnnStatus aclnnSwiGluGetWorkspaceSize(const aclTensor *x, int64_t dim, const aclTensor *out,
                                        uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnSwiGlu);
aclnnStatus aclnnSwiGluGradGetWorkspaceSize(const aclTensor *yGrad, const aclTensor *x,
                                            int64_t dim, const aclTensor *out,
                                            uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnSwiGluGrad);

/* GELU and its backward (aclnnop/aclnn_gelu_v2.h, aclnn_gelu_backward_v2.h, checked against
 * the CANN 8.1.RC1 headers; not in docs/cann-api.md). The V2 forms name the approximation: the
 * forward as an int64 (0 = "none", the erf form; 1 = "tanh"), the backward as a C string
 * ("none" or "tanh"). */
aclnnStatus aclnnGeluV2GetWorkspaceSize(const aclTensor *x, int64_t approximate, aclTensor *y,
                                        uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnGeluV2);
aclnnStatus aclnnGeluBackwardV2GetWorkspaceSize(const aclTensor *gradOutput, const aclTensor *self,
                                                char *approximate, aclTensor *gradInput,
                                                uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnGeluBackwardV2);

/* Rotary embedding and its backward (aclnn_rotary_position_embedding{,_grad}.h). */
aclnnStatus aclnnRotaryPositionEmbeddingGetWorkspaceSize(const aclTensor *x, const aclTensor *cos,
                                                         const aclTensor *sin, int64_t mode,
                                                         aclTensor *out, uint64_t *workspaceSize,
                                                         aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnRotaryPositionEmbedding);
aclnnStatus aclnnRotaryPositionEmbeddingGradGetWorkspaceSize(
    const aclTensor *dy, const aclTensor *cos, const aclTensor *sin, const aclTensor *xOptional,
    int64_t mode, const aclTensor *dxOut, const aclTensor *dcosOut, const aclTensor *dsinOut,
    uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnRotaryPositionEmbeddingGrad);

/* Softmax cross-entropy forward/backward (aclnn_cross_entropy_loss{,_grad}.h). */
aclnnStatus aclnnCrossEntropyLossGetWorkspaceSize(
    const aclTensor *input, const aclTensor *target, const aclTensor *weightOptional,
    char *reductionOptional, int64_t ignoreIndex, double labelSmoothing,
    double lseSquareScaleForZloss, bool returnZloss, const aclTensor *lossOut,
    const aclTensor *logProbOut, const aclTensor *zlossOut, const aclTensor *lseForZlossOut,
    uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnCrossEntropyLoss);
aclnnStatus aclnnCrossEntropyLossGradGetWorkspaceSize(
    const aclTensor *gradLoss, const aclTensor *logProb, const aclTensor *target,
    const aclTensor *weightOptional, const aclTensor *gradZlossOptional,
    const aclTensor *lseForZlossOptional, char *reductionOptional, int64_t ignoreIndex,
    double labelSmoothing, double lseSquareScaleForZloss, const aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnCrossEntropyLossGrad);

/* AdamW, in place; step is a 1-element device tensor holding t-1 (aclnn_apply_adam_w_v2.h). */
aclnnStatus aclnnApplyAdamWV2GetWorkspaceSize(aclTensor *varRef, aclTensor *mRef, aclTensor *vRef,
                                              aclTensor *maxGradNormOptionalRef,
                                              const aclTensor *grad, const aclTensor *step,
                                              float lr, float beta1, float beta2,
                                              float weightDecay, float eps, bool amsgrad,
                                              bool maximize, uint64_t *workspaceSize,
                                              aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnApplyAdamWV2);

/* Dtype conversion (aclnn_cast.h). */
aclnnStatus aclnnCastGetWorkspaceSize(const aclTensor *self, const aclDataType dtype,
                                      aclTensor *out, uint64_t *workspaceSize,
                                      aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnCast);

/* out = self + alpha * other, and its scalar / in-place forms (aclnn_add.h). */
aclnnStatus aclnnAddGetWorkspaceSize(const aclTensor *self, const aclTensor *other,
                                     const aclScalar *alpha, aclTensor *out,
                                     uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnAdd);
aclnnStatus aclnnAddsGetWorkspaceSize(const aclTensor *self, const aclScalar *other,
                                      const aclScalar *alpha, aclTensor *out,
                                      uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnAdds);
aclnnStatus aclnnInplaceAddGetWorkspaceSize(aclTensor *selfRef, const aclTensor *other,
                                            const aclScalar *alpha, uint64_t *workspaceSize,
                                            aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnInplaceAdd);

/* out = self * other, and its scalar / in-place forms (aclnn_mul.h). */
aclnnStatus aclnnMulGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                     uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnMul);
aclnnStatus aclnnMulsGetWorkspaceSize(const aclTensor *self, const aclScalar *other,
                                      aclTensor *out, uint64_t *workspaceSize,
                                      aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnMuls);
aclnnStatus aclnnInplaceMulGetWorkspaceSize(aclTensor *selfRef, const aclTensor *other,
                                            uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnInplaceMul);
aclnnStatus aclnnInplaceMulsGetWorkspaceSize(aclTensor *selfRef, const aclScalar *other,
                                             uint64_t *workspaceSize, aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnInplaceMuls);

/* Embedding lookup and its scatter-add backward (aclnn_embedding.h,
 * aclnn_embedding_dense_backward.h). */
aclnnStatus aclnnEmbeddingGetWorkspaceSize(const aclTensor *weight, const aclTensor *indices,
                                           aclTensor *out, uint64_t *workspaceSize,
                                           aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnEmbedding);
aclnnStatus aclnnEmbeddingDenseBackwardGetWorkspaceSize(const aclTensor *grad,
                                                        const aclTensor *indices,
                                                        uint64_t numWeights, uint64_t paddingIdx,
                                                        bool scaleGradByFreq, const aclTensor *out,
                                                        uint64_t *workspaceSize,
                                                        aclOpExecutor **executor);
CANNON_ACLNN_PHASE2(aclnnEmbeddingDenseBackward);

#ifdef __cplusplus
}
#endif

#endif /* CANNON_ACLNN_H_ */
