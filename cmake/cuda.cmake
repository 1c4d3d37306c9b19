# Decides whether the CUDA backend is built (BALLAST_WITH_CUDA). AUTO builds it when the CUDA
# Toolkit (nvcc, cuBLAS) and NCCL are found; ON fails without them; OFF never looks. The CPU
# build never needs nvcc.
#
# GPU architectures (CMAKE_CUDA_ARCHITECTURES, unless given): machine code for every CUDA
# device of configs/devices.json this toolkit can target, and PTX of the newest for GPUs after
# them: T4 sm_75, A100 sm_80, A10 sm_86, L4 and RTX 4090 sm_89, H100 and H200 sm_90. CUDA 13
# dropped Volta (sm_70): the V100 has no CUDA backend in a CUDA 13 build (a CUDA 12 toolkit,
# with -DCMAKE_CUDA_ARCHITECTURES=70, would build one; Ballast still plans for V100s). While
# iterating, -DCMAKE_CUDA_ARCHITECTURES=90 compiles one architecture only.
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
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND TARGET CUDA::cublas AND NCCL_INCLUDE_DIR
     AND NCCL_LIBRARY)
    set(BALLAST_WITH_CUDA ON)
  elseif(BALLAST_CUDA STREQUAL "ON")
    message(FATAL_ERROR "BALLAST_CUDA=ON but the CUDA Toolkit or NCCL was not found "
                        "(nvcc: '${CMAKE_CUDA_COMPILER}', cuBLAS: '${CUDA_cublas_LIBRARY}', "
                        "nccl.h: '${NCCL_INCLUDE_DIR}', libnccl: '${NCCL_LIBRARY}')")
  endif()
endif()

if(BALLAST_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;86-real;89-real;90")
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_FLAGS_RELWITHDEBINFO "-O3 -g")
  # Host-side warnings as for C; with BALLAST_WERROR they and nvcc's own are errors.
  if(BALLAST_WERROR)
    add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter,-Wno-format-truncation;-Werror=all-warnings>")
  else()
    add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Wno-format-truncation>")
  endif()
  add_library(nccl::nccl UNKNOWN IMPORTED)
  set_target_properties(nccl::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
if(BALLAST_WITH_CUDA)
  message(STATUS "Ballast CUDA backend: ON (BALLAST_CUDA=${BALLAST_CUDA}, architectures "
                 "${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "Ballast CUDA backend: OFF (BALLAST_CUDA=${BALLAST_CUDA})")
endif()
