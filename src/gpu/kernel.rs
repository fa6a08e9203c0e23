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

/// Compiled kernels by (label, entry point), so each WGSL entry point is compiled once per device.
#[derive(Default)]
pub struct KernelCache {
    kernels: std::cell::RefCell<HashMap<(String, String), Rc<Kernel>>>,
    /// While profiling: seconds and dispatches by kernel label (see [`Gpu::start_profile`]).
    profile: std::cell::RefCell<Option<HashMap<String, (u64, f64)>>>,
}

/// One kernel's share of a profiled stretch: its dispatches and their time, each dispatch submitted alone and
/// waited for, less the cost of an empty submit-and-wait measured when profiling started.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelTime {
    pub kernel: String,
    pub dispatches: u64,
    pub ms: f64,
}

impl Gpu {
    /// The kernel `entry` of WGSL `source` (compiled on first use; `label` names the source for errors).
    pub fn kernel(&self, label: &str, source: &str, entry: &str) -> Rc<Kernel> {
        let key = (label.to_string(), entry.to_string());
        if let Some(k) = self.kernels.kernels.borrow().get(&key) {
            return k.clone();
        }
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
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
    bind_group: wgpu::BindGroup,
    grid: (u32, u32, u32),
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

    pub fn dispatch_3d(&mut self, gpu: &Gpu, kernel: &Rc<Kernel>, buffers: &[&wgpu::Buffer], params: &[P], grid: (u32, u32, u32)) {
        let mut words: Vec<u32> = params.iter().map(|p| p.bits()).collect();
        words.resize(words.len().next_multiple_of(4).max(4), 0); // uniforms are 16-byte sized
        // written through the queue, not mapped at creation: a buffer mapped at creation on a lost WebGPU device
        // makes wgpu panic, where a write is just dropped
        let uniform = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: (words.len() * 4) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        gpu.queue.write_buffer(&uniform, 0, bytemuck::cast_slice(&words));
        let mut entries: Vec<wgpu::BindGroupEntry> =
            buffers.iter().enumerate().map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() }).collect();
        entries.push(wgpu::BindGroupEntry { binding: buffers.len() as u32, resource: uniform.as_entire_binding() });
        let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(&kernel.label), layout: &kernel.layout, entries: &entries });
        self.dispatches.push(Dispatch { kernel: kernel.clone(), bind_group, grid });
    }

    pub fn len(&self) -> usize {
        self.dispatches.len()
    }
    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// Encodes every dispatch into one compute pass and submits it.
    pub fn submit(self, gpu: &Gpu) {
        if gpu.is_profiling() {
            return self.submit_one_by_one(gpu);
        }
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            for d in &self.dispatches {
                pass.set_pipeline(&d.kernel.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[]);
                pass.dispatch_workgroups(d.grid.0, d.grid.1, d.grid.2);
            }
        }
        gpu.queue.submit([encoder.finish()]);
        gpu.count_submit(self.dispatches.len());
    }

    fn submit_one_by_one(self, gpu: &Gpu) {
        for d in &self.dispatches {
            let began = crate::clock::now_s();
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = encoder.begin_compute_pass(&Default::default());
                pass.set_pipeline(&d.kernel.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[]);
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
        gpu.count_submit(self.dispatches.len());
    }
}
