# Host-side code of the ROCm wheel against an older userland.
#
# Debian sid has the ROCm 6.4 toolchain llama.cpp needs, but its glibc (2.43) and libstdc++ (gcc 16) would
# make every library in the wheel need glibc 2.43. This toolchain file keeps sid's clang-21 (the HIP compiler)
# and ROCm headers/libraries, but compiles and links all C, C++ and the host half of HIP against a sysroot
# holding an older Debian's glibc and gcc libstdc++/libgcc/libgomp (tools/rocm/build-gfx906-wheel.sh unpacks
# it: bullseye = glibc 2.31 + gcc 10 by default, bookworm = glibc 2.36 + gcc 12). sid's /usr/include stays
# reachable, but only after the sysroot (clang adds ROCm's include dir
# with -idirafter), so glibc's headers come from the sysroot and no C23 redirects (__isoc23_strtol) appear.
#
#   CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=tools/rocm/sysroot-toolchain.cmake -DPYLLAMASPEC_SYSROOT=/opt/sysroot-bullseye"
set(PYLLAMASPEC_SYSROOT "$ENV{PYLLAMASPEC_SYSROOT}" CACHE PATH "sysroot with an old glibc + libstdc++ for host code")
set(PYLLAMASPEC_LLVM "/usr/lib/llvm-21" CACHE PATH "LLVM/clang install that compiles HIP")
if(NOT PYLLAMASPEC_SYSROOT OR NOT EXISTS "${PYLLAMASPEC_SYSROOT}/usr/include/stdio.h")
    message(FATAL_ERROR "sysroot-toolchain.cmake: PYLLAMASPEC_SYSROOT='${PYLLAMASPEC_SYSROOT}' is not a sysroot")
endif()
# the one gcc whose libstdc++/libgcc/libgomp the sysroot holds (bookworm: 12, bullseye: 10)
file(GLOB _gcc_dirs LIST_DIRECTORIES true "${PYLLAMASPEC_SYSROOT}/usr/lib/gcc/x86_64-linux-gnu/*")
list(FILTER _gcc_dirs INCLUDE REGEX "/[0-9]+$")
list(LENGTH _gcc_dirs _n)
if(NOT _n EQUAL 1)
    message(FATAL_ERROR "sysroot-toolchain.cmake: expected one gcc in ${PYLLAMASPEC_SYSROOT}, found: ${_gcc_dirs}")
endif()
list(GET _gcc_dirs 0 _gcc_dir)
set(_sr "--sysroot=${PYLLAMASPEC_SYSROOT} --gcc-install-dir=${_gcc_dir}")
# clang looks for the HIP runtime under the sysroot; point it back at the system's ROCm (headers, device libs)
set(_rocm "--rocm-path=/usr --rocm-device-lib-path=${PYLLAMASPEC_LLVM}/lib/clang/21/amdgcn/bitcode")
file(GLOB _devlib "${PYLLAMASPEC_LLVM}/lib/clang/*/amdgcn/bitcode")
if(_devlib)
    list(GET _devlib 0 _devlib)
    set(_rocm "--rocm-path=/usr --rocm-device-lib-path=${_devlib}")
endif()

set(CMAKE_C_COMPILER "${PYLLAMASPEC_LLVM}/bin/clang")
set(CMAKE_CXX_COMPILER "${PYLLAMASPEC_LLVM}/bin/clang++")
set(CMAKE_HIP_COMPILER "${PYLLAMASPEC_LLVM}/bin/clang++")
set(CMAKE_C_FLAGS_INIT "${_sr}")
set(CMAKE_CXX_FLAGS_INIT "${_sr}")
set(CMAKE_HIP_FLAGS_INIT "${_sr} ${_rocm}")
# `clang --hip-link` adds -lamdhip64, which the sysroot lacks. Offer it (and only it: not sid's libc or
# libstdc++) through a directory of its own.
set(_linkdir "${CMAKE_BINARY_DIR}/pyllamaspec-rocm-link")
file(MAKE_DIRECTORY "${_linkdir}")
foreach(_l amdhip64)
    if(EXISTS "/usr/lib/x86_64-linux-gnu/lib${_l}.so")
        file(CREATE_LINK "/usr/lib/x86_64-linux-gnu/lib${_l}.so" "${_linkdir}/lib${_l}.so" SYMBOLIC)
    endif()
endforeach()
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${_sr} -L${_linkdir}")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "${_sr} -L${_linkdir}")
# executables (only CMake's compiler checks build any) link against sid's libamdhip64, whose own
# dependencies live outside the sysroot: leave those unresolved instead of mixing sid's libc in
set(CMAKE_EXE_LINKER_FLAGS_INIT "${_sr} -L${_linkdir} -Wl,--allow-shlib-undefined")
# OpenMP from the sysroot's gcc (libgomp.so.1, glibc 2.36-era), not clang's libomp
foreach(_l C CXX)
    set(OpenMP_${_l}_FLAGS "-fopenmp=libgomp" CACHE STRING "")
    set(OpenMP_${_l}_LIB_NAMES "gomp" CACHE STRING "")
endforeach()
set(OpenMP_gomp_LIBRARY "${_gcc_dir}/libgomp.so" CACHE FILEPATH "")
