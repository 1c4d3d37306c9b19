#!/usr/bin/env bash
# Packs what a GPU machine without a package registry needs into .dev/gpu and, compressed,
# .dev/gpu.tar.xz (ignored by git; the device tool carries the archive): a build of this tree that runs on another x86-64 host, the
# shared libraries it and Open MPI need that such a machine may lack, and Debian's Open MPI
# unpacked with `dpkg -x`. CUDA's own libraries are not packed: the GPU machine's PyTorch
# install brings libcublas.so.13, libcudart and libnccl.so.2 (env.sh finds them).
#
# The build is configured under the path /tmp/ballast-src (a link to this tree), so that its
# absolute paths (CTest's files, the tests' BALLAST_EXE) hold on the GPU machine once env.sh
# makes the same link there.
#
# usage: bench/gpu/pack.sh     (ARCHS="90" CPU_ARCH=x86-64-v3 JOBS=2)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
archs=${ARCHS:-90}
cpu_arch=${CPU_ARCH:-x86-64-v3}
jobs=${JOBS:-2}
pack=.dev/gpu
rm -rf "$pack"
mkdir -p "$pack/lib" "$pack/mpi"
ln -sfn "$root" /tmp/ballast-src
cmake -S /tmp/ballast-src -B /tmp/ballast-src/$pack/build -DBALLAST_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$archs" -DBALLAST_CPU_ARCH="$cpu_arch" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build /tmp/ballast-src/$pack/build -j "$jobs"
# only what runs: executables and CTest's files
find "$pack/build" \( -name '*.o' -o -name '*.a' -o -name '*.d' \) -delete
find "$pack/build" -type d -name CMakeFiles -prune -exec rm -rf {} +

# Debian's Open MPI, unpacked (OPAL_PREFIX relocates it)
(cd "$pack/mpi" && apt-get download openmpi-bin libopenmpi3 openmpi-common > /dev/null &&
  for d in *.deb; do dpkg -x "$d" .; done && rm -f ./*.deb)

# every shared library the executables and Open MPI's plugins load, but glibc's and CUDA's
skip='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libcuda|libcudart|libcublas|libcublasLt|libnccl|libstdc\+\+|libgcc_s)\.so'
{
  find "$pack/build" -maxdepth 2 -type f -perm -u+x
  find "$pack/mpi" -name '*.so*' -type f
  find "$pack/mpi/usr/bin" -type f
} | while read -r f; do ldd "$f" 2> /dev/null || true; done |
  awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
    if ! [[ "$name" =~ $skip ]] && ! [ -e "$pack/lib/$name" ] &&
      [ -z "$(find "$pack/mpi" -name "$name" -print -quit)" ]; then
      cp -L "$path" "$pack/lib/$name"
    fi
  done

cat > "$pack/env.sh" << 'SH'
# source .dev/gpu/env.sh from the tree's root on the GPU machine
root=$(pwd)
ln -sfn "$root" /tmp/ballast-src
mpi="$root/.dev/gpu/mpi/usr"
export OPAL_PREFIX="$mpi" PATH="$mpi/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cuda_libs=""
for lib in libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
  found=$(find / -xdev -name "$lib" -not -path '*/.dev/gpu/*' 2> /dev/null | head -1)
  [ -n "$found" ] && cuda_libs="$cuda_libs:$(dirname "$found")"
  [ -z "$found" ] && echo "env.sh: $lib not found (the build needs CUDA 13's cuBLAS and NCCL)"
done
export LD_LIBRARY_PATH="$mpi/lib/x86_64-linux-gnu:$mpi/lib/x86_64-linux-gnu/openmpi/lib:$root/.dev/gpu/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BALLAST_BUILD=/tmp/ballast-src/.dev/gpu/build
echo "env.sh: build $BALLAST_BUILD, mpirun $(command -v mpirun), libraries $cuda_libs"
SH
# one compressed file travels (the device tool carries 64 MiB with the tree; OpenBLAS alone,
# with kernels for every x86 processor, is 36 MB unpacked)
tar -C .dev -cJf .dev/gpu.tar.xz gpu
du -sh "$pack" "$pack"/* .dev/gpu.tar.xz
