//! Generates the cluster's gRPC code from `proto/*.proto` with Debian's
//! `protoc` (package `protobuf-compiler`, which the scripts install).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    if std::env::var_os("PROTOC").is_none() && !std::path::Path::new("/usr/bin/protoc").exists() {
        return Err(
            "protoc not found: install Debian's protobuf-compiler (scripts/test does)".into(),
        );
    }
    tonic_prost_build::configure().compile_protos(&["proto/cluster.proto"], &["proto"])?;
    Ok(())
}
