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
}
