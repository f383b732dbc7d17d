//! The element-wise kernels of device DDP, compiled at run time by NVRTC (no CUDA
//! compiler at build time): the division by the world size, the copy or accumulation
//! of a gradient into its bucket, and the f16/bf16 narrowing of the compression hooks.
//!
//! Each computes exactly what the host DDP computes (`g / n` rounded once; f16 and bf16
//! rounded to nearest even as the `half` crate does; no fused multiply-add), so device
//! and host DDP agree bit for bit where the reduction itself does.

// Kernel launches through cudarc's launch builder and the NVRTC library probe.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{self, CompileOptions, Ptx};

use super::DeviceGrad;

const SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned short u16;
#define EACH(n) for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float bf16_to_f32(u16 b) {
    unsigned int x = ((unsigned int)b) << 16; float f;
    asm("mov.b32 %0, %1;" : "=f"(f) : "r"(x)); return f;
}
/* Round to nearest even, NaN kept quiet: the `half` crate's f32 -> bf16. */
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    unsigned int x; asm("mov.b32 %0, %1;" : "=r"(x) : "f"(f));
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
    if ((x & 0x8000u) != 0 && (x & 0x17fffu) != 0) return (u16)((x >> 16) + 1);
    return (u16)(x >> 16);
}
#define SAME(x) (x)

/* NAME: the kernels' suffix; S: how an element is stored; C: the type the arithmetic is
   done in; LOAD and STORE convert between them, rounding as the host's GradElement does
   (for f16/bf16: to f32, compute, round back after every operation). */
#define KERNELS(NAME, S, C, LOAD, STORE) \
extern "C" __global__ void div_##NAME(S* x, u64 n, C d) { EACH(n) x[i] = STORE(LOAD(x[i]) / d); } \
extern "C" __global__ void copy_div_##NAME(S* dst, const S* src, u64 n, C d) { EACH(n) dst[i] = STORE(LOAD(src[i]) / d); } \
extern "C" __global__ void add_div_##NAME(S* dst, const S* src, u64 n, C d) { \
    EACH(n) dst[i] = STORE(LOAD(dst[i]) + LOAD(STORE(LOAD(src[i]) / d))); } \
extern "C" __global__ void add_##NAME(S* dst, const S* src, u64 n) { EACH(n) dst[i] = STORE(LOAD(dst[i]) + LOAD(src[i])); } \
extern "C" __global__ void to_f16_##NAME(u16* dst, const S* src, u64 n) { EACH(n) dst[i] = f32_to_f16((float)LOAD(src[i])); } \
extern "C" __global__ void from_f16_##NAME(S* dst, const u16* src, u64 n) { EACH(n) dst[i] = STORE((C)f16_to_f32(src[i])); } \
extern "C" __global__ void to_bf16_##NAME(u16* dst, const S* src, u64 n) { EACH(n) dst[i] = f32_to_bf16((float)LOAD(src[i])); } \
extern "C" __global__ void from_bf16_##NAME(S* dst, const u16* src, u64 n) { EACH(n) dst[i] = STORE((C)bf16_to_f32(src[i])); }

KERNELS(float, float, float, SAME, SAME)
KERNELS(double, double, double, SAME, SAME)
KERNELS(f16, u16, float, f16_to_f32, f32_to_f16)
KERNELS(bf16, u16, float, bf16_to_f32, f32_to_bf16)
"#;

/// Every kernel of [`SOURCE`], by the name before its type suffix.
const KERNEL_NAMES: [&str; 8] = [
    "div",
    "copy_div",
    "add_div",
    "add",
    "to_f16",
    "from_f16",
    "to_bf16",
    "from_bf16",
];

/// The types the kernels come in, by their suffix (`DeviceGrad::C_TYPE`).
const TYPE_SUFFIXES: [&str; 4] = ["float", "double", "f16", "bf16"];

/// The compiled kernels, loaded on one device, each looked up once (with lazy module
/// loading, the first look-up of a function can synchronize the context: it must not
/// happen in the middle of backward).
#[derive(Debug)]
pub(crate) struct Kernels {
    functions: HashMap<String, CudaFunction>,
}

/// Why the kernels are not available.
#[derive(Debug)]
pub(crate) enum KernelError {
    /// libnvrtc does not load.
    NoNvrtc,
    /// NVRTC rejected the source (a bug) or the driver the PTX.
    Compile(String),
    /// A launch failed.
    Driver(DriverError),
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelError::NoNvrtc => f.write_str(
                "libnvrtc (CUDA's run-time compiler, libnvrtc.so) cannot be loaded: install the \
                 CUDA toolkit's NVRTC (or pip's nvidia-cuda-nvrtc) and add its directory to \
                 LD_LIBRARY_PATH",
            ),
            KernelError::Compile(e) => write!(f, "compiling the DDP kernels: {e}"),
            KernelError::Driver(e) => write!(f, "{e}"),
        }
    }
}

impl From<DriverError> for KernelError {
    fn from(e: DriverError) -> KernelError {
        KernelError::Driver(e)
    }
}

/// Threads per block, and at most this many blocks (the kernels stride over the rest).
const THREADS: u32 = 256;
const MAX_BLOCKS: u64 = 4096;

fn config(n: usize) -> LaunchConfig {
    let blocks = (n as u64).div_ceil(u64::from(THREADS)).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The virtual architecture to compile for on a device of compute capability
/// `major.minor`, as NVRTC numbers them (`90` for 9.0): the device's own when NVRTC
/// knows it, else the newest NVRTC knows below it (the driver compiles PTX forward), so
/// a GPU newer than the installed NVRTC still gets its kernels.
fn target_arch(major: i32, minor: i32) -> i32 {
    let device = major * 10 + minor;
    let mut count: std::ffi::c_int = 0;
    // SAFETY: NVRTC writes one int through the pointer, which points at `count`.
    if unsafe { nvrtc::sys::nvrtcGetNumSupportedArchs(&mut count) }
        .result()
        .is_err()
        || count <= 0
    {
        return device;
    }
    let mut archs: Vec<std::ffi::c_int> = vec![0; count as usize];
    // SAFETY: `archs` has room for the `count` ints NVRTC just said it writes.
    if unsafe { nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .is_err()
    {
        return device;
    }
    archs
        .into_iter()
        .filter(|&arch| arch <= device)
        .max()
        .unwrap_or(device)
}

/// The kernels as PTX for compute capability `major.minor` (NVRTC needs no GPU).
fn compile(major: i32, minor: i32) -> Result<Ptx, KernelError> {
    let arch = target_arch(major, minor);
    let opts = CompileOptions {
        // Bit-for-bit with the host: no contraction into fused multiply-adds, IEEE
        // division, denormals kept.
        fmad: Some(false),
        prec_div: Some(true),
        ftz: Some(false),
        options: vec![format!("--gpu-architecture=compute_{arch}")],
        ..Default::default()
    };
    nvrtc::compile_ptx_with_opts(SOURCE, opts).map_err(|e| KernelError::Compile(format!("{e:?}")))
}

impl Kernels {
    /// Compiles the kernels for the device of `stream` and loads them there.
    pub(crate) fn load(stream: &Arc<CudaStream>) -> Result<Kernels, KernelError> {
        // SAFETY: only dlopens the candidate library names and closes them again.
        if !unsafe { nvrtc::sys::is_culib_present() } {
            return Err(KernelError::NoNvrtc);
        }
        let ctx = stream.context();
        let (major, minor) = ctx.compute_capability()?;
        let module = ctx.load_module(compile(major, minor)?)?;
        let mut functions = HashMap::new();
        for ty in TYPE_SUFFIXES {
            for kernel in KERNEL_NAMES {
                let name = format!("{kernel}_{ty}");
                let function = module.load_function(&name)?;
                functions.insert(name, function);
            }
        }
        Ok(Kernels { functions })
    }

    fn function<T: DeviceGrad>(&self, name: &str) -> Result<&CudaFunction, KernelError> {
        let full = format!("{name}_{}", T::C_TYPE);
        self.functions.get(&full).ok_or_else(|| {
            KernelError::Compile(format!("internal error: no kernel {full} was loaded"))
        })
    }

    /// `x[i] /= n` on `stream`.
    pub(crate) fn divide<T: DeviceGrad>(
        &self,
        stream: &Arc<CudaStream>,
        x: &mut CudaViewMut<'_, T>,
        n: usize,
    ) -> Result<(), KernelError> {
        let f = self.function::<T>("div")?;
        let (len, d) = (x.len() as u64, T::divisor(n));
        // SAFETY: `div_T(T*, u64, T)` matches the arguments; the kernel touches
        // elements below `len`, the length of the view it is given.
        unsafe {
            stream
                .launch_builder(f)
                .arg(x)
                .arg(&len)
                .arg(&d)
                .launch(config(len as usize))?
        };
        Ok(())
    }

    /// `dst[i] = src[i] / n` (`accumulate`: `dst[i] += src[i] / n`; with `n` = 1 the
    /// division is skipped, as it changes nothing).
    pub(crate) fn store<T: DeviceGrad>(
        &self,
        stream: &Arc<CudaStream>,
        dst: &mut CudaViewMut<'_, T>,
        src: &CudaView<'_, T>,
        n: usize,
        accumulate: bool,
    ) -> Result<(), KernelError> {
        let len = dst.len() as u64;
        let d = T::divisor(n);
        let name = match (accumulate, n) {
            (false, 1) => {
                stream.memcpy_dtod(src, dst)?;
                return Ok(());
            }
            (true, 1) => "add",
            (false, _) => "copy_div",
            (true, _) => "add_div",
        };
        let f = self.function::<T>(name)?;
        let mut launch = stream.launch_builder(f);
        launch.arg(dst).arg(src).arg(&len);
        if n != 1 {
            launch.arg(&d);
        }
        // SAFETY: `copy_div_T`/`add_div_T(T*, const T*, u64, T)` and `add_T(T*, const
        // T*, u64)` match the arguments pushed; `src` and `dst` hold `len` elements
        // (the caller checks the lengths) and do not overlap (a gradient is never its
        // own bucket).
        unsafe { launch.launch(config(len as usize))? };
        Ok(())
    }

    /// `dst[i] = narrow(src[i])`, f16 (`bf16` false) or bf16 (`N`, two bytes), rounded
    /// to nearest even.
    pub(crate) fn narrow<T: DeviceGrad, N>(
        &self,
        stream: &Arc<CudaStream>,
        dst: &mut CudaSlice<N>,
        src: &CudaSlice<T>,
        bf16: bool,
    ) -> Result<(), KernelError> {
        let len = src.len().min(dst.len());
        let name = if bf16 { "to_bf16" } else { "to_f16" };
        self.convert::<T, _, _>(stream, name, dst, src, len)
    }

    /// `dst[i] = widen(src[i])`, the inverse of [`Kernels::narrow`] (exact).
    pub(crate) fn widen<T: DeviceGrad, N>(
        &self,
        stream: &Arc<CudaStream>,
        dst: &mut CudaSlice<T>,
        src: &CudaSlice<N>,
        bf16: bool,
    ) -> Result<(), KernelError> {
        let len = src.len().min(dst.len());
        let name = if bf16 { "from_bf16" } else { "from_f16" };
        self.convert::<T, _, _>(stream, name, dst, src, len)
    }

    /// Launches conversion kernel `name` (for `T`) over the first `len` elements.
    fn convert<T: DeviceGrad, D, S>(
        &self,
        stream: &Arc<CudaStream>,
        name: &str,
        dst: &mut CudaSlice<D>,
        src: &CudaSlice<S>,
        len: usize,
    ) -> Result<(), KernelError> {
        let f = self.function::<T>(name)?;
        let n = len as u64;
        // SAFETY: the conversion kernels are `(D*, const S*, u64)` with one side `T`
        // and the other two-byte f16/bf16 (`unsigned short`), as the callers pass them;
        // both buffers hold at least `len` elements (the callers take the minimum).
        unsafe {
            stream
                .launch_builder(f)
                .arg(dst)
                .arg(src)
                .arg(&n)
                .launch(config(len))?
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel source compiles (NVRTC needs no GPU, only libnvrtc: pip's
    /// nvidia-cuda-nvrtc on LD_LIBRARY_PATH is enough), for the oldest architecture CUDA 13
    /// compiles for (sm_75) and for Hopper, and every kernel the code asks for is in it.
    /// `RINGCCL_DUMP_PTX=FILE` writes Hopper's PTX there, to compare two versions.
    #[test]
    fn the_kernels_compile_where_nvrtc_loads() {
        // SAFETY: only dlopens the candidate library names and closes them again.
        if !unsafe { nvrtc::sys::is_culib_present() } {
            println!("the_kernels_compile_where_nvrtc_loads: skipped: libnvrtc cannot be loaded");
            return;
        }
        assert_eq!(target_arch(9, 0), 90, "NVRTC 12 and 13 know Hopper");
        // A GPU newer than this NVRTC: the newest architecture it knows, which compiles.
        let newest = target_arch(99, 9);
        assert!((90..=999).contains(&newest), "fell back to {newest}");
        for (major, minor) in [(7, 5), (9, 0), (99, 9)] {
            let ptx = compile(major, minor).unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
            let text = ptx.to_src();
            for ty in TYPE_SUFFIXES {
                for kernel in KERNEL_NAMES {
                    let name = format!(".entry {kernel}_{ty}(");
                    assert!(text.contains(&name), "{name} missing for sm_{major}{minor}");
                }
            }
            assert!(
                !text.contains("fma.rn.f32"),
                "no contraction into fused multiply-adds"
            );
            if let (9, Ok(path)) = (major, std::env::var("RINGCCL_DUMP_PTX")) {
                std::fs::write(path, &text).unwrap();
            }
        }
        println!("the_kernels_compile_where_nvrtc_loads: ok");
    }
}
