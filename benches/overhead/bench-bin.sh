# Sourced by the scripts beside it: builds the bench and sets `bin` to the
# path of its binary (run from the workspace root).
cargo bench -p tower-rate-tier-overhead --no-run >/dev/null 2>&1
bin=$(cargo bench -p tower-rate-tier-overhead --no-run --message-format=json 2>/dev/null \
  | grep -o '"executable":"[^"]*overhead[^"]*"' | head -1 | cut -d'"' -f4)
