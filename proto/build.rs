//! Compiles every `.proto` under `proto/cairn/` with the vendored `protoc`, so a build needs no
//! system protobuf compiler, and writes the descriptor set that gRPC server reflection serves.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: tonic-prost-build reads `PROTOC` from the environment; this build script is
    // single-threaded, so nothing reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let protos = [
        "cairn/v1/raft.proto",
        "cairn/v1/cluster.proto",
        "cairn/v1/gateway.proto",
        "cairn/admin/v1/admin.proto",
    ];
    println!("cargo:rerun-if-changed=build.rs");
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("cairn_descriptor.bin"))
        // Operator-facing messages serialise to JSON as they are (`cairnctl --output json`).
        .type_attribute(".cairn.admin.v1", "#[derive(serde::Serialize)]")
        // Undecodable messages are INVALID_ARGUMENT, not INTERNAL (`src/codec.rs`).
        .codec_path("crate::codec::StrictCodec")
        .build_server(true)
        .build_client(true)
        .compile_protos(&protos, &["."])?;
    Ok(())
}
