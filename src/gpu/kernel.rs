//! Compute kernels and how they are dispatched: a [`Kernel`] is one WGSL entry point with its pipeline; a
//! [`Pass`] collects dispatches (kernel, buffers, parameters, grid) and submits them as one command buffer.
//!
//! Binding convention for every kernel: storage buffers at bindings 0..n in the order given, then the
//! parameters as a uniform at binding n. Parameters are plain `u32`/`f32` words (see [`P`]).

use super::Gpu;
use std::collections::HashMap;
use std::rc::Rc;

/// One word of a kernel's uniform parameters.
#[derive(Clone, Copy, Debug)]
pub enum P {
    U(u32),
    F(f32),
}

impl P {
    fn bits(self) -> u32 {
        match self {
            P::U(u) => u,
            P::F(f) => f.to_bits(),
        }
    }
}

pub struct Kernel {
    pub label: String,
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// `source` with the text from `marks[0]` through the end of `marks[1]` replaced by `with`: a variant swapping a
/// piece its shader marks with a comment at each end.
pub fn replace_marked(source: &mut String, marks: [&str; 2], with: &str) {
    let at = source.find(marks[0]).unwrap_or_else(|| panic!("the shader marks {:?}", marks[0]));
    let end = at + source[at..].find(marks[1]).unwrap_or_else(|| panic!("the shader marks {:?}", marks[1])) + marks[1].len();
    source.replace_range(at..end, with);
}

/// `source` with its first `from` (a line the shader must have, such as a constant's default) replaced by `to`.
pub fn replace_once(source: &mut String, from: &str, to: &str) {
    let at = source.find(from).unwrap_or_else(|| panic!("the shader has {from:?}"));
    source.replace_range(at..at + from.len(), to);
}

/// Shaders built without naga's index clamps natively. Every index into their workgroup and local arrays is a
/// constant, or made of local_invocation_index (below the workgroup size) and loop counters bounded by constants,
/// and stays below its array's length by the tile layouts the shader describes (each tile's largest index was
/// checked by hand); every storage write is checked against arrayLength, and storage reads stay inside their
/// bindings (Vulkan's robustBufferAccess, which wgpu enables, keeps them there regardless). In the browser Tint
/// clamps them all the same, and the browser tests run these kernels; `forward`'s test of the checked kernels
/// runs them both ways. On the H100, without the clamps a 2048-token chunk of the Flash-width model prefilled
/// 5 % faster (`lingtab bench --checked-kernels` measures both); decode did not move.
const UNCLAMPED: &[&str] = &["matmul.wgsl"];

/// Compiled kernels by (label, entry point), so each WGSL entry point is compiled once per device.
#[derive(Default)]
pub struct KernelCache {
    kernels: std::cell::RefCell<HashMap<(String, String, bool), Rc<Kernel>>>,
    /// While profiling: seconds and dispatches by kernel label (see [`Gpu::start_profile`]).
    profile: std::cell::RefCell<Option<HashMap<String, (u64, f64)>>>,
    bindings: Bindings,
}

/// One kernel's share of a stretch: its dispatches and their time. Profiled ([`Gpu::take_profile`]): each
/// dispatch submitted alone and waited for, less an empty submit-and-wait; in a timeline
/// ([`Gpu::take_timeline`]): how much later each dispatch finished than the one before it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelTime {
    pub kernel: String,
    pub dispatches: u64,
    pub ms: f64,
}

impl Gpu {
    /// The kernel `entry` of WGSL `source` (compiled on first use; `label` names the source for errors).
    pub fn kernel(&self, label: &str, source: &str, entry: &str) -> Rc<Kernel> {
        self.kernel_with(label, entry, || source)
    }

    /// [`Gpu::kernel`] of a source assembled by `build` (a variant of a shader): built once per process for
    /// `label`, which must name everything the source depends on (it is the compiled kernel's key too).
    pub fn kernel_built(&self, label: &str, entry: &str, build: impl FnOnce() -> String) -> Rc<Kernel> {
        self.kernel_with(label, entry, || {
            static SOURCES: std::sync::OnceLock<std::sync::Mutex<HashMap<String, &'static str>>> = std::sync::OnceLock::new();
            let mut sources = SOURCES.get_or_init(Default::default).lock().unwrap();
            *sources.entry(label.to_string()).or_insert_with(|| Box::leak(build().into_boxed_str()))
        })
    }

    /// [`Gpu::kernel`] with the source made only when the kernel is not built yet (sources assembled from
    /// variants, looked up on every dispatch otherwise).
    pub fn kernel_with<'s>(&self, label: &str, entry: &str, source: impl FnOnce() -> &'s str) -> Rc<Kernel> {
        let checked = self.kernels_checked.get();
        let key = (label.to_string(), entry.to_string(), checked);
        if let Some(k) = self.kernels.kernels.borrow().get(&key) {
            return k.clone();
        }
        let desc = wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(source().into()) };
        // naga's forced loop bounding (a counter in every loop, against infinite ones) keeps the driver's compiler
        // from unrolling loops, so each iteration's loads wait for the last one's: on the H100 a decode token took
        // about a quarter longer with it, and the chunked prefill ran at two thirds of the speed. Every loop in
        // shaders/ ends (bounded by constants, or by parameters the Rust side checks, with steps that are never
        // zero), so it is off unless asked for ([`Gpu::set_checked_kernels`]).
        // naga's index clamps (a min() on every array index it cannot prove in range) stay, except in the shaders
        // of UNCLAMPED, whose products read their tiles in workgroup memory at an index per multiply-add or two.
        let unclamped = !checked && UNCLAMPED.iter().any(|shader| label.starts_with(shader));
        let checks = wgpu::ShaderRuntimeChecks { force_loop_bounding: checked, bounds_checks: !unclamped, ..wgpu::ShaderRuntimeChecks::checked() };
        // SAFETY: no loop of these shaders runs forever (above), and UNCLAMPED's indices stay in range (its doc).
        let module = unsafe { self.device.create_shader_module_trusted(desc, checks) };
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        let kernel = Rc::new(Kernel { label: format!("{label}:{entry}"), pipeline, layout });
        self.kernels.kernels.borrow_mut().insert(key, kernel.clone());
        kernel
    }

    /// Starts timing every dispatch by kernel (native only: a pass then runs one dispatch at a time, each
    /// waited for, so the totals show where GPU time goes, not how fast the engine runs).
    pub fn start_profile(&self) {
        self.kernels.profile.replace(Some(HashMap::new()));
    }

    pub fn is_profiling(&self) -> bool {
        self.kernels.profile.borrow().is_some()
    }

    /// The kernels' times since the last call (or since [`Gpu::start_profile`]), slowest first; profiling goes on.
    pub fn take_profile(&self) -> Vec<KernelTime> {
        let Some(by_kernel) = self.kernels.profile.borrow_mut().as_mut().map(std::mem::take) else { return Vec::new() };
        let empty = self.empty_submit_s();
        let mut times: Vec<KernelTime> = by_kernel
            .into_iter()
            .map(|(kernel, (dispatches, s))| KernelTime { kernel, dispatches, ms: 1e3 * (s - dispatches as f64 * empty).max(0.0) })
            .collect();
        times.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        times
    }

    /// Seconds of one empty submit and wait (what every profiled dispatch pays on top of its work).
    fn empty_submit_s(&self) -> f64 {
        let reps = 20;
        let began = crate::clock::now_s();
        for _ in 0..reps {
            self.queue.submit([self.device.create_command_encoder(&Default::default()).finish()]);
            self.wait_idle();
        }
        (crate::clock::now_s() - began) / reps as f64
    }

    fn wait_idle(&self) {
        #[cfg(not(target_arch = "wasm32"))]
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
    }
}

struct Dispatch {
    kernel: Rc<Kernel>,
    buffers: Vec<wgpu::Buffer>,
    /// The parameter words, padded to the 16 bytes uniforms are sized in.
    words: Vec<u32>,
    grid: (u32, u32, u32),
}

/// Off: every dispatch gets a new bind group (`lingtab bench --no-bind-cache`, to compare).
static BIND_CACHE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

pub fn set_bind_cache(on: bool) {
    BIND_CACHE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The parameters of a submission's dispatches: one uniform buffer, written once per submission, each dispatch
/// reading its own aligned slice; and the bind groups made over it, kept for the next submission that binds the
/// same kernel, buffers and slice (a decode step repeats the last one's dispatches). A write made after a
/// submission is ordered after it on the queue, so each submission sees its own parameters.
#[derive(Default)]
pub struct Bindings {
    params: std::cell::RefCell<Option<wgpu::Buffer>>,
    groups: std::cell::RefCell<HashMap<BindKey, wgpu::BindGroup>>,
}

#[derive(PartialEq, Eq, Hash)]
struct BindKey {
    kernel: usize,
    buffers: Vec<wgpu::Buffer>,
    offset: u64,
    size: u64,
}

/// Bind groups kept at most; past this the cache starts afresh (a kept group keeps its buffers alive).
const MAX_BIND_GROUPS: usize = 2048;
/// Bytes between two dispatches' parameters: WebGPU's largest allowed minUniformBufferOffsetAlignment.
const PARAMS_STRIDE: u64 = 256;

impl Gpu {
    /// A uniform buffer of at least `size` bytes for a submission's parameters (grown, never shrunk).
    fn params_buffer(&self, size: u64) -> wgpu::Buffer {
        let b = &self.kernels.bindings;
        let mut params = b.params.borrow_mut();
        if let Some(buffer) = params.as_ref().filter(|p| p.size() >= size) {
            return buffer.clone();
        }
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: size.next_power_of_two().max(64 * PARAMS_STRIDE),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        // the kept groups bind the old buffer
        b.groups.borrow_mut().clear();
        *params = Some(buffer.clone());
        buffer
    }

    fn bind_group(&self, d: &Dispatch, params: &wgpu::Buffer, offset: u64) -> wgpu::BindGroup {
        let size = (d.words.len() * 4) as u64;
        let make = || {
            let mut entries: Vec<wgpu::BindGroupEntry> =
                d.buffers.iter().enumerate().map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() }).collect();
            let slice = wgpu::BufferBinding { buffer: params, offset, size: wgpu::BufferSize::new(size) };
            entries.push(wgpu::BindGroupEntry { binding: d.buffers.len() as u32, resource: wgpu::BindingResource::Buffer(slice) });
            self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(&d.kernel.label), layout: &d.kernel.layout, entries: &entries })
        };
        if !BIND_CACHE.load(std::sync::atomic::Ordering::Relaxed) {
            return make();
        }
        let key = BindKey { kernel: Rc::as_ptr(&d.kernel) as usize, buffers: d.buffers.clone(), offset, size };
        let mut groups = self.kernels.bindings.groups.borrow_mut();
        if let Some(g) = groups.get(&key) {
            return g.clone();
        }
        if groups.len() >= MAX_BIND_GROUPS {
            groups.clear();
        }
        let group = make();
        groups.insert(key, group.clone());
        group
    }

    /// Lets go of the kept bind groups (and so of the buffers only they still hold).
    pub fn forget_bindings(&self) {
        self.kernels.bindings.groups.borrow_mut().clear();
    }
}

/// Dispatches recorded in order; `submit` runs them in one compute pass.
#[derive(Default)]
pub struct Pass {
    dispatches: Vec<Dispatch>,
}

impl Pass {
    pub fn new() -> Pass {
        Pass::default()
    }

    /// Records `kernel` over `buffers` (storage, in binding order) with `params`, on `workgroups` workgroups
    /// (spread over x and y when there are more than one dimension allows; kernels bounds-check).
    pub fn dispatch(&mut self, gpu: &Gpu, kernel: &Rc<Kernel>, buffers: &[&wgpu::Buffer], params: &[P], workgroups: u32) {
        let (x, y) = gpu.grid(workgroups);
        self.dispatch_3d(gpu, kernel, buffers, params, (x, y, 1));
    }

    pub fn dispatch_3d(&mut self, _gpu: &Gpu, kernel: &Rc<Kernel>, buffers: &[&wgpu::Buffer], params: &[P], grid: (u32, u32, u32)) {
        let mut words: Vec<u32> = params.iter().map(|p| p.bits()).collect();
        words.resize(words.len().next_multiple_of(4).max(4), 0); // uniforms are 16-byte sized
        assert!(words.len() * 4 <= PARAMS_STRIDE as usize, "{}: more parameters than a slice holds", kernel.label);
        self.dispatches.push(Dispatch { kernel: kernel.clone(), buffers: buffers.iter().map(|&b| b.clone()).collect(), words, grid });
    }

    pub fn len(&self) -> usize {
        self.dispatches.len()
    }
    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// Writes the parameters (one write) and the bind groups, then the dispatches, in order.
    fn bind(&self, gpu: &Gpu) -> Vec<wgpu::BindGroup> {
        if self.dispatches.is_empty() {
            return Vec::new();
        }
        let params = gpu.params_buffer(self.dispatches.len() as u64 * PARAMS_STRIDE);
        let mut bytes = vec![0u8; self.dispatches.len() * PARAMS_STRIDE as usize];
        for (i, d) in self.dispatches.iter().enumerate() {
            bytes[i * PARAMS_STRIDE as usize..][..d.words.len() * 4].copy_from_slice(bytemuck::cast_slice(&d.words));
        }
        // written through the queue, not mapped: a buffer mapped on a lost WebGPU device makes wgpu panic, where
        // a write is just dropped
        gpu.queue.write_buffer(&params, 0, &bytes);
        self.dispatches.iter().enumerate().map(|(i, d)| gpu.bind_group(d, &params, i as u64 * PARAMS_STRIDE)).collect()
    }

    /// Encodes every dispatch into one compute pass and submits it.
    pub fn submit(self, gpu: &Gpu) -> wgpu::SubmissionIndex {
        self.submit_then_copy(gpu, None)
    }

    /// [`Pass::submit`], with `copy` = (from, to, bytes) copied after the dispatches in the same submission (a
    /// result into a buffer that can be mapped, read once this submission is done: [`Gpu::read_mapped`]).
    pub fn submit_then_copy(self, gpu: &Gpu, copy: Option<(&wgpu::Buffer, &wgpu::Buffer, u64)>) -> wgpu::SubmissionIndex {
        if gpu.is_profiling() {
            self.submit_one_by_one(gpu);
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            if let Some((from, to, bytes)) = copy {
                encoder.copy_buffer_to_buffer(from, 0, to, 0, bytes);
            }
            return gpu.queue.submit([encoder.finish()]);
        }
        let began = crate::clock::now_s();
        let groups = self.bind(gpu);
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        // a timeline's timestamps: before the first dispatch, then after each
        let stamps = (gpu.is_recording_timeline() && !self.dispatches.is_empty()).then(|| gpu.timeline_queries(self.dispatches.len()));
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            if let Some((queries, ..)) = &stamps {
                pass.write_timestamp(queries, 0);
            }
            for (i, (d, group)) in self.dispatches.iter().zip(&groups).enumerate() {
                pass.set_pipeline(&d.kernel.pipeline);
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(d.grid.0, d.grid.1, d.grid.2);
                if let Some((queries, ..)) = &stamps {
                    pass.write_timestamp(queries, i as u32 + 1);
                }
            }
        }
        if let Some((queries, resolved, read)) = stamps {
            let count = self.dispatches.len() as u32 + 1;
            encoder.resolve_query_set(&queries, 0..count, &resolved, 0);
            encoder.copy_buffer_to_buffer(&resolved, 0, &read, 0, count as u64 * 8);
            gpu.keep_stamps(super::timeline::Stamps { read, dispatches: self.dispatches.iter().map(|d| (d.kernel.label.clone(), d.grid)).collect() });
        }
        if let Some((from, to, bytes)) = copy {
            encoder.copy_buffer_to_buffer(from, 0, to, 0, bytes);
        }
        let index = gpu.queue.submit([encoder.finish()]);
        gpu.count_submit(self.dispatches.len(), crate::clock::now_s() - began);
        index
    }

    fn submit_one_by_one(self, gpu: &Gpu) {
        // one slice per dispatch, so the later writes wait for nothing: each submission is waited for anyway
        let groups = self.bind(gpu);
        for (d, group) in self.dispatches.iter().zip(&groups) {
            let began = crate::clock::now_s();
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = encoder.begin_compute_pass(&Default::default());
                pass.set_pipeline(&d.kernel.pipeline);
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(d.grid.0, d.grid.1, d.grid.2);
            }
            gpu.queue.submit([encoder.finish()]);
            gpu.wait_idle();
            let took = crate::clock::now_s() - began;
            if let Some(by_kernel) = gpu.kernels.profile.borrow_mut().as_mut() {
                let e = by_kernel.entry(d.kernel.label.clone()).or_default();
                e.0 += 1;
                e.1 += took;
            }
        }
        gpu.count_submit(self.dispatches.len(), 0.0);
    }
}
