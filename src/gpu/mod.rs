//! The GPU: adapter and device (WebGPU in the browser, Vulkan natively), buffers, readback, and the kernels
//! (one WGSL file per kernel family in `shaders/`, included at compile time).

pub mod bandwidth;
pub mod dequant;
pub mod kda;
pub mod kernel;
pub mod matmul;
pub mod matvec;
pub mod mla;
pub mod moe;
pub mod norm;
pub mod timeline;

pub use kernel::{Kernel, Pass, P};

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub struct GpuError(pub String);

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for GpuError {}

/// What the adapter is, for people and logs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub features: Vec<String>,
    /// Subgroup lanes the kernels shuffle across (None: the device has no subgroup operations)
    pub subgroup_lanes: Option<u32>,
    /// Whether the device has f16 arithmetic in shaders (`shader-f16`)
    pub shader_f16: bool,
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.name.is_empty() { "(unnamed adapter)" } else { &self.name };
        write!(
            f,
            "{name} [{} {}{}] maxBufferSize {} maxStorageBufferBindingSize {}{}",
            self.backend,
            self.device_type,
            if self.driver.is_empty() { String::new() } else { format!(", {}", self.driver) },
            self.max_buffer_size,
            self.max_storage_buffer_binding_size,
            self.subgroup_lanes.map(|l| format!(" subgroups of {l}+")).unwrap_or_default()
        )?;
        if self.shader_f16 {
            write!(f, " shader-f16")?;
        }
        Ok(())
    }
}

/// wgpu leaves the name empty on the web; GPUAdapterInfo has vendor and architecture ("google swiftshader").
#[cfg(target_arch = "wasm32")]
async fn browser_adapter_name() -> Option<String> {
    use wasm_bindgen::JsValue;
    let get = |obj: &JsValue, key: &str| js_sys::Reflect::get(obj, &JsValue::from_str(key)).ok().filter(|v| !v.is_undefined());
    let gpu = get(&get(&js_sys::global(), "navigator")?, "gpu")?;
    let request: js_sys::Function = get(&gpu, "requestAdapter")?.into();
    let adapter = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(request.call0(&gpu).ok()?)).await.ok()?;
    let info = get(&adapter, "info")?;
    let parts: Vec<String> = ["vendor", "architecture", "description"].iter().filter_map(|k| get(&info, k)?.as_string()).filter(|s| !s.is_empty()).collect();
    Some(parts.join(" "))
}

#[cfg(not(target_arch = "wasm32"))]
async fn browser_adapter_name() -> Option<String> {
    None
}

/// The least the kernels need beyond WebGPU's defaults-or-better (the workgroup sizes and shared memory of
/// `shaders/*.wgsl`: the expert tiles' 16 KiB of tiles and their entry's 16 bytes; the expert kernel's five
/// storage buffers). Buffer sizes are checked where buffers are made.
fn check_limits(limits: &wgpu::Limits) -> Result<(), GpuError> {
    let needs = [
        ("maxStorageBuffersPerShaderStage", limits.max_storage_buffers_per_shader_stage, 5),
        ("maxComputeInvocationsPerWorkgroup", limits.max_compute_invocations_per_workgroup, 256),
        ("maxComputeWorkgroupSizeX", limits.max_compute_workgroup_size_x, 256),
        ("maxComputeWorkgroupStorageSize", limits.max_compute_workgroup_storage_size, 16400),
        ("maxComputeWorkgroupsPerDimension", limits.max_compute_workgroups_per_dimension, 1024),
    ];
    for (name, have, need) in needs {
        if have < need {
            return Err(GpuError(format!("the GPU adapter's {name} is {have}; lingtab needs at least {need}")));
        }
    }
    Ok(())
}

/// What the engine asked of the GPU so far: benchmarks divide these by tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct GpuCounters {
    pub dispatches: u64,
    pub submits: u64,
    /// Readbacks: each one waits for the GPU (a CPU↔GPU sync).
    pub readbacks: u64,
    /// Seconds the CPU spent turning recorded passes into command buffers and submitting them (bind groups,
    /// encoding, `queue.submit`): work the GPU cannot overlap when each token ends in a readback.
    pub encode_s: f64,
    /// Seconds the CPU waited in readbacks for the GPU to finish (with one readback per token: the GPU time
    /// that the CPU did not overlap).
    pub wait_s: f64,
}

/// An adapter, its device and queue.
pub struct Gpu {
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub summary: AdapterSummary,
    kernels: kernel::KernelCache,
    /// Why the device was lost, once it is (set by wgpu's device-lost callback).
    lost: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    /// The first GPU error nobody caught (a validation or out-of-memory error): the results after it are
    /// not to be trusted.
    uncaptured: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    counters: std::cell::Cell<GpuCounters>,
    /// Lanes a subgroup is sure to have (the adapter's least subgroup size) where the device has subgroup
    /// operations (natively; wgpu's WebGPU backend does not pass the feature through): reductions shuffle
    /// across that many lanes before workgroup memory takes over.
    subgroup_lanes: Option<u32>,
    subgroups_on: std::cell::Cell<bool>,
    /// Whether the device has f16 arithmetic (`shader-f16`, requested where the adapter offers it).
    shader_f16: bool,
    f16_on: std::cell::Cell<bool>,
    cpu_kernels_on: std::cell::Cell<bool>,
    /// Whether kernels built from now on keep all of wgpu's runtime checks ([`Gpu::set_checked_kernels`]).
    kernels_checked: std::cell::Cell<bool>,
    /// While recording a timeline ([`Gpu::start_timeline`]): the submissions' timestamps on their way back.
    timeline: std::cell::RefCell<Option<Vec<timeline::Stamps>>>,
}

impl Gpu {
    /// The best adapter of the platform's backend (WebGPU in the browser, Vulkan natively), with a device
    /// that has the adapter's own limits.
    pub async fn new() -> Result<Gpu, GpuError> {
        Self::with_limits(|_| {}).await
    }

    /// [`Gpu::new`] with a device whose limits `adjust` lowers from the adapter's (to try the engine on the
    /// limits of a smaller GPU than the one here).
    pub async fn with_limits(adjust: impl FnOnce(&mut wgpu::Limits)) -> Result<Gpu, GpuError> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = if cfg!(target_arch = "wasm32") { wgpu::Backends::BROWSER_WEBGPU } else { wgpu::Backends::VULKAN };
        let instance = wgpu::Instance::new(desc);
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                GpuError(format!(
                    "no WebGPU/Vulkan adapter found ({e}); in a browser, WebGPU needs Chrome or Edge 113+ on a machine with a supported GPU"
                ))
            })?;
        let mut limits = adapter.limits();
        adjust(&mut limits);
        check_limits(&limits)?;
        let info = adapter.get_info();
        let subgroups = adapter.features().contains(wgpu::Features::SUBGROUP) && info.subgroup_min_size.is_power_of_two();
        let subgroup_lanes = subgroups.then_some(info.subgroup_min_size.min(32));
        // timestamps inside compute passes, where the adapter has them, for `lingtab bench --timeline`
        let stamps = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let timestamps = if adapter.features().contains(stamps) { stamps } else { wgpu::Features::empty() };
        let shader_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let f16 = if shader_f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("lingtab"),
                required_features: (if subgroups { wgpu::Features::SUBGROUP } else { wgpu::Features::empty() }) | timestamps | f16,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError(format!("the adapter refused a device: {e}")))?;
        let lost = std::sync::Arc::new(std::sync::Mutex::new(None));
        let on_lost = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            *on_lost.lock().unwrap() = Some(format!("{reason:?}: {message}"));
        });
        let uncaptured = std::sync::Arc::new(std::sync::Mutex::new(None));
        let on_error = uncaptured.clone();
        // recorded, not a panic: the next readback reports it as an error
        device.on_uncaptured_error(std::sync::Arc::new(move |e: wgpu::Error| {
            #[cfg(target_arch = "wasm32")]
            web_sys::console::error_1(&format!("lingtab: WebGPU error: {e}").into());
            let mut message = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                message = format!("{message}: {c}");
                cause = c.source();
            }
            on_error.lock().unwrap().get_or_insert(message);
        }));
        let summary = AdapterSummary {
            name: if info.name.is_empty() { browser_adapter_name().await.unwrap_or_default() } else { info.name },
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: [info.driver, info.driver_info].iter().filter(|s| !s.is_empty()).cloned().collect::<Vec<_>>().join(" "),
            max_buffer_size: limits.max_buffer_size,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size as u64,
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            features: adapter.features().iter_names().map(|(n, _)| n.to_string()).collect(),
            subgroup_lanes,
            shader_f16,
        };
        Ok(Gpu { adapter, device, queue, summary, kernels: Default::default(), lost, uncaptured, counters: Default::default(), subgroup_lanes, subgroups_on: std::cell::Cell::new(true), shader_f16, f16_on: std::cell::Cell::new(true), cpu_kernels_on: std::cell::Cell::new(true), kernels_checked: std::cell::Cell::new(false), timeline: Default::default() })
    }

    /// Whether to take the kernels for a CPU adapter (SwiftShader, lavapipe; in the browser, a fallback
    /// adapter): matrix-vector products with one invocation a row and no barrier, and a decode step's attention
    /// by the online-softmax kernel rather than by products (whose tiles' workgroup memory took SwiftShader 1.4 s
    /// to compile). A barrier makes SwiftShader run a workgroup's invocations as coroutines. True on such an
    /// adapter unless [`Gpu::set_cpu_kernels`] turned them off.
    pub fn cpu_kernels(&self) -> bool {
        self.summary.device_type == "Cpu" && self.cpu_kernels_on.get()
    }

    /// Off: kernels chosen from now on are a GPU's (products with a group of lanes a row, attention by products)
    /// on a CPU adapter too (to test them where the tests run).
    pub fn set_cpu_kernels(&self, on: bool) {
        self.cpu_kernels_on.set(on);
    }

    /// The lanes the kernels may reduce across by subgroup shuffles: None without subgroups, or once
    /// [`Gpu::set_subgroups`] turned them off.
    pub fn subgroup_lanes(&self) -> Option<u32> {
        self.subgroup_lanes.filter(|_| self.subgroups_on.get())
    }

    /// Off: kernels built from now on reduce through workgroup memory only, as on a device without subgroups
    /// (to test and measure the plain path on one that has them).
    pub fn set_subgroups(&self, on: bool) {
        self.subgroups_on.set(on);
    }

    /// Whether products may multiply in f16 (which do: [`matmul::multiplies_in_f16`]): the device has
    /// `shader-f16` and [`Gpu::set_f16`] did not turn it off.
    pub fn f16_products(&self) -> bool {
        self.shader_f16 && self.f16_on.get()
    }

    /// Off: products dispatched from now on multiply in f32 only, as on a device without `shader-f16` (to test
    /// and measure the plain path on one that has it).
    pub fn set_f16(&self, on: bool) {
        self.f16_on.set(on);
    }

    /// On: kernels built from now on keep all of wgpu's runtime checks (naga's forced loop bounding, a counter in
    /// every loop, and its index clamps), which the engine leaves out where it can (see `Gpu::kernel_with`); to
    /// measure what they cost and to test that the kernels compute the same either way. Native only: the
    /// browser's WebGPU compiles WGSL its own way.
    pub fn set_checked_kernels(&self, on: bool) {
        self.kernels_checked.set(on);
    }

    pub fn counters(&self) -> GpuCounters {
        self.counters.get()
    }

    fn count(&self, f: impl FnOnce(&mut GpuCounters)) {
        let mut c = self.counters.get();
        f(&mut c);
        self.counters.set(c);
    }

    /// Counts a submission of `dispatches` kernels (the passes call this as they submit).
    pub(crate) fn count_submit(&self, dispatches: usize, encode_s: f64) {
        self.count(|c| {
            c.submits += 1;
            c.dispatches += dispatches as u64;
            c.encode_s += encode_s;
        });
    }

    /// An error once the device is lost or has raised an error nobody caught; work on it is pointless then.
    pub fn check(&self) -> Result<(), GpuError> {
        if let Some(why) = self.lost.lock().unwrap().as_ref() {
            return Err(GpuError(format!("the GPU device was lost ({why}): load the engine again (the store is kept)")));
        }
        if let Some(e) = self.uncaptured.lock().unwrap().as_ref() {
            return Err(GpuError(format!("the GPU reported an error, so its results cannot be trusted: {e}; load the engine again")));
        }
        Ok(())
    }

    /// Runs `work` (the engine's load: buffers made and filled) with the GPU's out-of-memory and validation
    /// errors caught, so that either is the load's error — `explain` turns it into a message with the numbers —
    /// rather than an uncaught error met at the first step; a device lost meanwhile is the load's error too.
    pub async fn catching<T>(&self, explain: impl FnOnce(&str) -> String, work: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
        let out_of_memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let result = work.await;
        let invalid = validation.pop().await;
        let oom = out_of_memory.pop().await;
        #[cfg(not(target_arch = "wasm32"))]
        let _ = self.device.poll(wgpu::PollType::Poll);
        // a lost device first: its uploads fail validation as a consequence, not a cause
        self.check().map_err(|e| e.0)?;
        if let Some(e) = oom.or(invalid) {
            return Err(explain(&e.to_string()));
        }
        result
    }

    pub fn storage_buffer(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// A buffer of `size` bytes that copies land in and the CPU maps to read ([`Gpu::read_mapped`]).
    pub fn mappable_buffer(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `bytes` (padded with zeros to a multiple of 4).
    pub fn upload(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        let buffer = self.storage_buffer(label, bytes.len() as u64);
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().next_multiple_of(4), 0);
        self.queue.write_buffer(&buffer, 0, &padded);
        buffer
    }

    /// Copies `size` bytes of `buffer` back to the CPU.
    pub async fn read_back(&self, buffer: &wgpu::Buffer, size: u64) -> Result<Vec<u8>, GpuError> {
        self.check()?;
        let size = size.next_multiple_of(4);
        let staging = self.mappable_buffer("readback", size);
        let mut encoder = self.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, size);
        let copied = self.queue.submit([encoder.finish()]);
        self.count(|c| c.submits += 1);
        self.read_mapped(&staging, copied, size).await
    }

    /// A buffer that can be mapped for reading ([`Gpu::mappable_buffer`]), read once submission `after` (the last to
    /// write it) is done, whatever was submitted since: the CPU can read one step's result while the GPU runs the
    /// next. Counts as a readback (a sync).
    pub async fn read_mapped(&self, staging: &wgpu::Buffer, after: wgpu::SubmissionIndex, size: u64) -> Result<Vec<u8>, GpuError> {
        self.check()?;
        self.count(|c| c.readbacks += 1);
        let waited_from = crate::clock::now_s();
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.slice(..size).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        #[cfg(not(target_arch = "wasm32"))]
        if let Err(e) = self.device.poll(wgpu::PollType::Wait { submission_index: Some(after), timeout: None }) {
            // a submission that failed (the device lost, or an error in it) has no index to wait for: say why
            self.check()?;
            return Err(GpuError(format!("waiting for the GPU failed ({e}): the GPU device was lost or is out of memory; load the engine again (the store is kept)")));
        }
        #[cfg(target_arch = "wasm32")]
        let _ = after; // the browser maps the buffer once the work that writes it is done
        let mapped = rx.await.map_err(|_| GpuError("the GPU device was lost during a readback: load the engine again (the store is kept)".into()))?;
        let waited = crate::clock::now_s() - waited_from;
        self.count(|c| c.wait_s += waited);
        if let Err(e) = mapped {
            // a fresh readback buffer fails to map when the device is gone; in the browser the loss itself is
            // reported a moment later, so say what it means either way
            #[cfg(target_arch = "wasm32")]
            crate::js::sleep_ms(0).await;
            self.check()?;
            return Err(GpuError(format!("reading results back from the GPU failed ({e}): the GPU device was lost or is out of memory; load the engine again (the store is kept)")));
        }
        let data = staging.slice(..size).get_mapped_range().map_err(|e| GpuError(format!("readback: {e}")))?.to_vec();
        staging.unmap();
        // the work before this readback may have failed or lost the device: never hand back its results
        self.check()?;
        Ok(data)
    }

    /// Splits `n_workgroups` over x and y so neither exceeds the adapter's per-dimension limit
    /// (kernels recover the linear index from `num_workgroups`); the overshoot is bounds-checked in the kernels.
    pub fn grid(&self, n_workgroups: u32) -> (u32, u32) {
        let max = self.device.limits().max_compute_workgroups_per_dimension.max(1);
        if n_workgroups <= max {
            (n_workgroups.max(1), 1)
        } else {
            let y = n_workgroups.div_ceil(max);
            (n_workgroups.div_ceil(y), y)
        }
    }
}
