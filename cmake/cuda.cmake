# Decides whether the CUDA backend is built (BALLAST_WITH_CUDA). AUTO builds it when the CUDA
# Toolkit (nvcc, cuBLAS) and NCCL are found; the CPU build never needs nvcc.
set(BALLAST_WITH_CUDA OFF)
if(NOT BALLAST_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(BALLAST_WITH_CUDA ON)
  elseif(BALLAST_CUDA STREQUAL "ON")
    message(FATAL_ERROR "BALLAST_CUDA=ON but the CUDA Toolkit or NCCL was not found "
                        "(nvcc: '${CMAKE_CUDA_COMPILER}', nccl.h: '${NCCL_INCLUDE_DIR}', "
                        "libnccl: '${NCCL_LIBRARY}')")
  endif()
endif()
message(STATUS "Ballast CUDA backend: ${BALLAST_WITH_CUDA} (BALLAST_CUDA=${BALLAST_CUDA})")
