# Sourced by the set-up scripts: installs the Debian packages Ballast needs that are missing,
# then configures and builds into build/ (BALLAST_BUILD overrides the folder).
packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libglpk-dev
          libcunit1-dev libcjson-dev libopenblas-dev gnuplot-nox python3 python3-torch)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
build=${BALLAST_BUILD:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build "$build" -j "$(nproc)"
