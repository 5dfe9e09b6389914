//! A thin layer over the CUDA driver API (cudarc's raw `sys` bindings): every call's result is
//! checked and turned into `Error::Backend` naming the call, and the handful of objects the
//! backend owns (context, streams, modules, events, graphs) get typed wrappers.
//!
//! cudarc loads libcuda at run time and panics when it is absent, so `driver_present` must be
//! asked before anything else here is called.

use std::ffi::{c_void, CStr};
use std::ptr;

use cudarc::driver::sys;

use crate::error::{Error, Result};

pub(crate) type DevPtr = sys::CUdeviceptr;

/// Whether an NVIDIA driver (libcuda) can be loaded at all. Everything else in this module needs
/// it: cudarc panics when the library is missing.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library; no CUDA call is made.
    unsafe { sys::is_culib_present() }
}

pub(crate) fn cuda_err(msg: impl std::fmt::Display) -> Error {
    Error::Backend(format!("cuda: {msg}"))
}

/// The error name and description of a driver result.
fn describe(r: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = ptr::null();
    let mut desc: *const std::ffi::c_char = ptr::null();
    // SAFETY: both calls write a pointer to a static string (or leave it null on failure).
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut desc);
    }
    let s = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: the driver returns NUL-terminated static strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    format!("{} ({})", s(name), s(desc))
}

/// Turn a driver result into `Ok` or an error naming `what`.
pub(crate) fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cuda_err(format!("{what}: {}", describe(r))))
    }
}

pub(crate) fn is_oom(r: sys::CUresult) -> bool {
    r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// The device, its primary context and what the backend needs to know about it.
pub(crate) struct Device {
    pub dev: sys::CUdevice,
    pub ctx: sys::CUcontext,
    pub name: String,
    pub sms: u32,
    pub cc: (i32, i32),
    pub total_mem: u64,
    pub max_smem_optin: u32,
    pub driver_version: i32,
}

// SAFETY: a CUDA context handle may be used from any thread once made current there (which
// `Device::bind` does before every use).
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: writes one int.
    check(
        unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

impl Device {
    /// Initialise the driver and retain the primary context of device `ordinal`.
    pub(crate) fn open(ordinal: i32) -> Result<Device> {
        // SAFETY: plain driver calls with valid out-pointers; the library is present (checked by
        // the caller through `driver_present`).
        unsafe {
            check(sys::cuInit(0), "cuInit")?;
            let mut n = 0;
            check(sys::cuDeviceGetCount(&mut n), "cuDeviceGetCount")?;
            if n <= ordinal {
                return Err(cuda_err("no CUDA device found"));
            }
            let mut dev = 0;
            check(sys::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
            let mut buf = [0 as std::ffi::c_char; 256];
            check(sys::cuDeviceGetName(buf.as_mut_ptr(), 255, dev), "cuDeviceGetName")?;
            let name = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            let mut total = 0usize;
            check(sys::cuDeviceTotalMem_v2(&mut total, dev), "cuDeviceTotalMem")?;
            let mut version = 0;
            check(sys::cuDriverGetVersion(&mut version), "cuDriverGetVersion")?;
            use sys::CUdevice_attribute as A;
            let sms = attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let major = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            let optin = attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
            let mut ctx = ptr::null_mut();
            check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
            let d = Device {
                dev,
                ctx,
                name,
                sms: sms.max(1) as u32,
                cc: (major, minor),
                total_mem: total as u64,
                max_smem_optin: optin.max(0) as u32,
                driver_version: version,
            };
            d.bind()?;
            Ok(d)
        }
    }

    /// Make the context current on the calling thread (cheap when it already is).
    pub(crate) fn bind(&self) -> Result<()> {
        thread_local! {
            static CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        }
        let me = self.ctx as usize;
        if CURRENT.with(|c| c.get()) == me {
            return Ok(());
        }
        // SAFETY: the context is retained for the lifetime of `self`.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")?;
        CURRENT.with(|c| c.set(me));
        Ok(())
    }

    /// Free and total device memory in bytes.
    pub(crate) fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes.
        check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }, "cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: releases the reference taken in `open`.
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// A non-blocking stream (no implicit synchronisation with the legacy default stream).
pub(crate) struct Stream(pub sys::CUstream);

// SAFETY: stream handles are thread-safe in the driver API.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn new() -> Result<Stream> {
        let mut s = ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
            "cuStreamCreate",
        )?;
        Ok(Stream(s))
    }

    pub(crate) fn sync(&self) -> Result<()> {
        // SAFETY: valid stream handle.
        check(
            unsafe { sys::cuStreamSynchronize(self.0) },
            "cuStreamSynchronize (an earlier kernel failed)",
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: valid stream handle, destroyed once.
        unsafe {
            sys::cuStreamDestroy_v2(self.0);
        }
    }
}

/// A loaded module (one embedded fatbin).
pub(crate) struct Module(pub sys::CUmodule);

// SAFETY: module and function handles are usable from any thread of the context.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    pub(crate) fn load(image: &[u8], name: &str) -> Result<Module> {
        // cuModuleLoadData needs the image to stay valid only during the call; fatbins are
        // 8-byte aligned in a copy we own here (include_bytes! gives no alignment guarantee).
        let mut owned = vec![0u64; image.len().div_ceil(8)];
        // SAFETY: `owned` has at least image.len() bytes.
        unsafe { ptr::copy_nonoverlapping(image.as_ptr(), owned.as_mut_ptr() as *mut u8, image.len()) };
        let mut m = ptr::null_mut();
        // SAFETY: valid image pointer for the duration of the call.
        check(
            unsafe { sys::cuModuleLoadData(&mut m, owned.as_ptr() as *const c_void) },
            &format!("loading kernels-cuda/{name}.cu (a GPU this build has no code for?)"),
        )?;
        Ok(Module(m))
    }

    pub(crate) fn function(&self, name: &str) -> Result<sys::CUfunction> {
        let c = std::ffi::CString::new(name).map_err(|_| cuda_err("kernel name contains NUL"))?;
        let mut f = ptr::null_mut();
        // SAFETY: valid module and NUL-terminated name.
        check(
            unsafe { sys::cuModuleGetFunction(&mut f, self.0, c.as_ptr()) },
            &format!("kernel {name}"),
        )?;
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: valid module handle, unloaded once.
        unsafe {
            sys::cuModuleUnload(self.0);
        }
    }
}

/// Allow `f` up to `bytes` of dynamic shared memory per block.
pub(crate) fn set_max_dynamic_smem(f: sys::CUfunction, bytes: u32) -> Result<()> {
    // SAFETY: valid function handle.
    check(
        unsafe {
            sys::cuFuncSetAttribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        },
        "cuFuncSetAttribute(max dynamic shared memory)",
    )
}

// ---- memory ----------------------------------------------------------------------------------

/// `cuMemAlloc`; `Err(None)` means out of memory (the caller reports sizes), `Err(Some)` another
/// failure.
pub(crate) fn mem_alloc(bytes: usize) -> std::result::Result<DevPtr, Option<Error>> {
    let mut p = 0;
    // SAFETY: writes one device pointer.
    let r = unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) };
    if is_oom(r) {
        return Err(None);
    }
    check(r, "cuMemAlloc").map_err(Some)?;
    Ok(p)
}

pub(crate) fn mem_free(p: DevPtr) {
    // SAFETY: `p` came from cuMemAlloc and is freed once (by its owner's Drop).
    unsafe {
        sys::cuMemFree_v2(p);
    }
}

/// Synchronous host-to-device copy (weights, uploads).
pub(crate) fn htod_sync(dst: DevPtr, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: `src` is valid for its length; the device range was allocated at least this large.
    check(
        unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len()) },
        "cuMemcpyHtoD",
    )
}

/// Host-to-device copy ordered on `stream`. From pageable memory the driver stages the bytes
/// before returning, so `src` may be dropped right after.
pub(crate) fn htod_async(dst: DevPtr, src: &[u8], stream: &Stream) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: as htod_sync.
    check(
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), stream.0) },
        "cuMemcpyHtoDAsync",
    )
}

/// Device-to-host copy ordered after everything on `stream`, then wait for it.
pub(crate) fn dtoh(dst: &mut [u8], src: DevPtr, stream: &Stream) -> Result<()> {
    if dst.is_empty() {
        return stream.sync();
    }
    // SAFETY: `dst` is valid for writes of its length; the device range holds at least as much.
    check(
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len(), stream.0) },
        "cuMemcpyDtoHAsync",
    )?;
    stream.sync()
}

/// Page-locked host memory: where an asynchronous device-to-host copy can land while the host
/// goes on (a copy to pageable memory blocks the host until it is done).
pub(crate) struct Pinned {
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: plain host memory owned by this value; the driver allows freeing it from any thread.
unsafe impl Send for Pinned {}

impl Pinned {
    pub(crate) fn new(len: usize) -> Result<Pinned> {
        let mut p = ptr::null_mut();
        // SAFETY: writes one pointer to `len` bytes of page-locked memory.
        check(unsafe { sys::cuMemAllocHost_v2(&mut p, len.max(1)) }, "cuMemAllocHost")?;
        // Zeroed once, so every byte `bytes` can hand out is initialised.
        // SAFETY: `p` points to `len.max(1)` writable bytes.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, len.max(1)) };
        Ok(Pinned {
            ptr: p,
            len: len.max(1),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The first `n` bytes (at most `len`): what a copy into them left once it has completed.
    pub(crate) fn bytes(&self, n: usize) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised bytes (zeroed at allocation); the caller reads
        // them only after the copy that writes them has completed (`Event::sync`).
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, n.min(self.len)) }
    }

    /// Queue a copy of `n` bytes from `src` into this memory on `stream` (`n <= len`).
    pub(crate) fn dtoh_async(&mut self, src: DevPtr, n: usize, stream: &Stream) -> Result<()> {
        if n > self.len {
            return Err(cuda_err(format!("pinned copy of {n} bytes into {}", self.len)));
        }
        // SAFETY: the host range is ours and `n` bytes long; the device range holds at least `n`.
        check(
            unsafe { sys::cuMemcpyDtoHAsync_v2(self.ptr, src, n, stream.0) },
            "cuMemcpyDtoHAsync",
        )
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAllocHost, freed once (the context outlives it).
        unsafe {
            sys::cuMemFreeHost(self.ptr);
        }
    }
}

pub(crate) fn memset0_async(dst: DevPtr, bytes: usize, stream: sys::CUstream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the range lies in one allocation (checked by the caller).
    check(
        unsafe { sys::cuMemsetD8Async(dst, 0, bytes, stream) },
        "cuMemsetD8Async",
    )
}

pub(crate) fn dtod_async(dst: DevPtr, src: DevPtr, bytes: usize, stream: sys::CUstream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: both ranges lie in allocations of at least `bytes` (checked by the caller).
    check(
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) },
        "cuMemcpyDtoDAsync",
    )
}

// ---- kernels ---------------------------------------------------------------------------------

/// Launch `f` on `stream` with one by-value parameter block. `pdl`: allow the kernel to start
/// before the previous one on the stream has finished (it waits in `grid_dep_wait`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    f: sys::CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    stream: sys::CUstream,
    params: *const c_void,
    pdl: bool,
) -> Result<()> {
    // SAFETY: an all-zero launch attribute is a valid value (id 0 = ignore, padding zeroed).
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: smem,
        hStream: stream,
        attrs: if pdl { &mut attr } else { ptr::null_mut() },
        numAttrs: u32::from(pdl),
    };
    let mut p = [params as *mut c_void];
    // SAFETY: `params` points to the kernel's parameter block (one struct, passed by value),
    // valid for the duration of the call; the driver copies it.
    check(
        unsafe { sys::cuLaunchKernelEx(&cfg, f, p.as_mut_ptr(), ptr::null_mut()) },
        "cuLaunchKernelEx",
    )
}

// ---- events ----------------------------------------------------------------------------------

pub(crate) struct Event(pub sys::CUevent);

// SAFETY: event handles are usable from any thread of the context.
unsafe impl Send for Event {}

impl Event {
    pub(crate) fn new() -> Result<Event> {
        let mut e = ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32) },
            "cuEventCreate",
        )?;
        Ok(Event(e))
    }

    pub(crate) fn record(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: valid event and stream.
        check(unsafe { sys::cuEventRecord(self.0, stream) }, "cuEventRecord")
    }

    /// An event the host waits for by sleeping (not spinning, the driver's default) and that
    /// takes no timestamps: for reads started ahead, where the device has the next step queued
    /// and the wake-up latency costs nothing, so a generating process does not hold a core busy.
    pub(crate) fn new_blocking() -> Result<Event> {
        use sys::CUevent_flags as F;
        let flags = F::CU_EVENT_BLOCKING_SYNC as u32 | F::CU_EVENT_DISABLE_TIMING as u32;
        let mut e = ptr::null_mut();
        // SAFETY: writes one handle.
        check(unsafe { sys::cuEventCreate(&mut e, flags) }, "cuEventCreate")?;
        Ok(Event(e))
    }

    /// Block until the work before the event's record is done.
    pub(crate) fn sync(&self) -> Result<()> {
        // SAFETY: valid event.
        check(
            unsafe { sys::cuEventSynchronize(self.0) },
            "cuEventSynchronize (an earlier kernel failed)",
        )
    }

    /// Milliseconds from `start` to `self` (both recorded and complete).
    pub(crate) fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: valid events.
        check(
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.0, self.0) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: valid event, destroyed once.
        unsafe {
            sys::cuEventDestroy_v2(self.0);
        }
    }
}

// ---- graphs ----------------------------------------------------------------------------------

/// An instantiated CUDA graph (a recorded decode step).
pub(crate) struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles may be used from any thread; the backend serialises launches of one
// graph behind its cache lock.
unsafe impl Send for Graph {}

/// Begin capturing `stream` in thread-local mode (other threads are unaffected).
pub(crate) fn begin_capture(stream: sys::CUstream) -> Result<()> {
    // SAFETY: valid stream.
    check(
        unsafe { sys::cuStreamBeginCapture_v2(stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) },
        "cuStreamBeginCapture",
    )
}

/// End the capture of `stream` (always call it after `begin_capture`, also after a failure, to
/// leave capture mode) and instantiate the graph.
pub(crate) fn end_capture(stream: sys::CUstream) -> Result<Graph> {
    let mut graph = ptr::null_mut();
    // SAFETY: valid stream in capture mode; writes one handle.
    check(
        unsafe { sys::cuStreamEndCapture(stream, &mut graph) },
        "cuStreamEndCapture",
    )?;
    if graph.is_null() {
        return Err(cuda_err("stream capture produced no graph"));
    }
    let mut exec = ptr::null_mut();
    // SAFETY: valid graph; writes one handle.
    let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
    if let Err(e) = check(r, "cuGraphInstantiate") {
        // SAFETY: the graph is ours and not instantiated.
        unsafe {
            sys::cuGraphDestroy(graph);
        }
        return Err(e);
    }
    Ok(Graph { graph, exec })
}

impl Graph {
    pub(crate) fn launch(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: valid executable graph and stream.
        check(unsafe { sys::cuGraphLaunch(self.exec, stream) }, "cuGraphLaunch")
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: owned handles, destroyed once. An executable graph still running is freed by
        // the driver when it completes.
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}
