/* What bindgen reads: the CUDA runtime API of the toolkit the build script found. */
#include <cuda_runtime_api.h>
