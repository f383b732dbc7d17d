//! GPU helpers shared by the tests that need one (`tests/nccl.rs`, `tests/device_ddp.rs`).

use std::sync::Arc;

use ringccl::cudarc::driver::{CudaModule, CudaStream, LaunchConfig, PushKernelArg};

/// A kernel that keeps `stream` busy for `seconds` (the GPU's global timer). Returns its
/// module, which must outlive the kernel: unloading a module waits for its kernels.
#[allow(unsafe_code)] // one kernel launch, with its SAFETY comment
pub fn occupy(stream: &Arc<CudaStream>, seconds: f64) -> Arc<CudaModule> {
    const SPIN: &str = r#"
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"#;
    let ptx = ringccl::cudarc::nvrtc::compile_ptx(SPIN).unwrap();
    let module = stream.context().load_module(ptx).unwrap();
    let spin = module.load_function("spin").unwrap();
    let ns = (seconds * 1e9) as u64;
    let mut launch = stream.launch_builder(&spin);
    launch.arg(&ns);
    // SAFETY: spin(unsigned long long) takes the one argument pushed; it touches no
    // memory.
    unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }.unwrap();
    module
}
