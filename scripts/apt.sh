# Sourced by the set-up scripts that install a Debian package (dnsmasq, tinyproxy, chromium).
# They run side by side under scripts/test, so each apt step waits for apt's lock and is
# tried again.
apt() {  # apt ARGS...: apt-get as root (sudo where needed), waiting for its lock, 3 tries
  local sudo="" try
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  for try in 1 2 3; do
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=120 "$@" >/dev/null \
      && return 0
    sleep $((try * 5))
  done
  return 1
}
