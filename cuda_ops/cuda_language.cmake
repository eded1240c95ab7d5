# Included from the top-level CMakeLists.txt (enable_language must run in the
# highest directory whose targets link CUDA objects): decides whether nvcc
# compiles cuda_ops/*.cu.
#
#   DEPTHBENCH_CUDA=AUTO (default)  use nvcc when found (PATH, CUDACXX or
#                                   /usr/local/cuda/bin/nvcc)
#   DEPTHBENCH_CUDA=ON              fail when it is not found
#   DEPTHBENCH_CUDA=OFF             never compile CUDA
#   DEPTHBENCH_CUDA_ARCHS           default "80;90" (A100, H100/H200); CUDA 13
#                                   dropped everything below sm_75
#
# Sets DEPTHBENCH_HAVE_CUDA_KERNELS.
set(DEPTHBENCH_CUDA AUTO CACHE STRING "Compile the CUDA kernels: AUTO, ON or OFF")
set_property(CACHE DEPTHBENCH_CUDA PROPERTY STRINGS AUTO ON OFF)
set(DEPTHBENCH_CUDA_ARCHS "80;90" CACHE STRING "CUDA architectures for cuda_ops")
set(DEPTHBENCH_HAVE_CUDA_KERNELS OFF)
if(NOT DEPTHBENCH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(_db_nvcc_on_path nvcc)
    if(NOT _db_nvcc_on_path)
      set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${DEPTHBENCH_CUDA_ARCHS})
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(DEPTHBENCH_HAVE_CUDA_KERNELS ON)
    message(STATUS "depthbench: CUDA kernels with ${CMAKE_CUDA_COMPILER} "
                   "(${CMAKE_CUDA_COMPILER_VERSION}), archs ${CMAKE_CUDA_ARCHITECTURES}")
  elseif(DEPTHBENCH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DEPTHBENCH_CUDA=ON but no CUDA compiler was found")
  else()
    message(STATUS "depthbench: no CUDA compiler; cuda_ops builds its CPU references only")
  endif()
endif()
