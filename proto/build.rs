//! Compiles every `.proto` under `proto/cairn/` with the vendored `protoc`, so a build needs no
//! system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free alternative to `set_var`: tonic-prost-build reads `PROTOC` from the environment,
    // and build scripts run single-threaded before any other thread exists.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let protos = ["cairn/v1/raft.proto", "cairn/v1/cluster.proto", "cairn/v1/gateway.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure().build_server(true).build_client(true).compile_protos(&protos, &["."])?;
    Ok(())
}
