//! `tb-rls`: an Envoy-compatible rate limit service backed by the redis-tb module (work in progress: this
//! placeholder only makes the workspace member exist so the module and the service build side by side).
#![forbid(unsafe_code)]

fn main() {
    println!("tb-rls {}", env!("CARGO_PKG_VERSION"));
}
