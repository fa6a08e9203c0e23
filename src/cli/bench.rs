//! `lingtab bench`: prefill and decode speed with what each token costs (syncs, dispatches, submissions, store
//! bytes, cache hits), with every expert resident and with a streaming pool, as one table (or JSON).
//! `lingtab bench-kernels`: the matrix-vector products at Ling 3.0 Flash's shapes against the memory-read rate
//! measured in the same run, and the small kernels of a decode step's layer (µs each, beside the dispatch floor).

use super::run::ModelPath;
use crate::engine::bench::{self, BenchPlan, BenchRow};
use crate::engine::EngineOptions;
use crate::gpu::matvec::{self, Matrix, PoolChunk, Strided};
use crate::gpu::{kda, moe, norm, Gpu, Pass};
use crate::quant::GgmlType;

fn list<T: std::str::FromStr>(what: &str, s: &str) -> Result<Vec<T>, String> {
    s.split(',').filter(|v| !v.trim().is_empty()).map(|v| v.trim().parse::<T>().map_err(|_| format!("{what}: {v:?} is not a number"))).collect()
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Prompt lengths to prefill, comma-separated
    #[arg(long, default_value = "128,512,2048")]
    pub prompts: String,
    /// Tokens decoded (greedy) after each prompt
    #[arg(long, default_value_t = 128)]
    pub decode: usize,
    /// Streaming pools to run besides all-resident, as fractions of the experts (comma-separated; empty: none)
    #[arg(long, default_value = "0.05")]
    pub pools: String,
    /// Prefill chunk sizes, comma-separated (1, token by token, is the baseline and always runs first) [default:
    /// 1 and the engine's default chunk, 1024]
    #[arg(long)]
    pub chunks: Option<String>,
    /// Skip the all-resident engine (for models whose experts do not fit the GPU)
    #[arg(long)]
    pub no_resident: bool,
    /// Seed of the prompts' token ids
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the rows as JSON
    #[arg(long)]
    pub json: bool,
    /// Time each kernel (every dispatch then runs alone and is waited for: the rows' speeds no longer count)
    #[arg(long)]
    pub profile: bool,
    /// Record every dispatch's GPU timestamps and print where the GPU's time went in the stream (per kernel, and
    /// idle between submissions); native, where the adapter has timestamps inside compute passes
    #[arg(long)]
    pub timeline: bool,
    /// Products over more than 64 tokens on wide tiles (64 × 64) instead of big ones (128 × 128)
    #[arg(long)]
    pub no_big_tiles: bool,
    /// Split a chunk's dense product by columns when its tiles are fewer workgroups than this (0: never)
    #[arg(long, default_value_t = 256)]
    pub split_target: u32,
    /// Tiles of the experts' products of every chunk over 16 tokens, instead of blocks or wide by the experts'
    /// average pairs: blocks (64 rows × 16 pairs, weights decoded into registers), blocks-near (the same, a row's
    /// 4 invocations side by side), blocks-tall (128 rows × 16 pairs, two rows an invocation), blocks-quad (the
    /// same, four rows an invocation), wide (64 rows × 64 pairs, weights decoded into workgroup memory) or rows
    /// (128 rows × 16 pairs, an invocation a row)
    #[arg(long)]
    pub expert_tiles: Option<String>,
    /// A new bind group for every dispatch instead of the ones kept from the last submission
    #[arg(long)]
    pub no_bind_cache: bool,
    /// Reductions through workgroup memory only, even where the device has subgroup operations
    #[arg(long)]
    pub no_subgroups: bool,
    /// Big tiles (products over more than 64 tokens) multiplied in f32 only, even where the device has
    /// `shader-f16`
    #[arg(long)]
    pub no_f16: bool,
    /// One product per matrix for the matrices of a layer that read the same input, instead of one per stack
    #[arg(long)]
    pub no_stacks: bool,
    /// An MoE layer's shared expert as products of its own, not as one more batch of its selected experts'
    #[arg(long)]
    pub no_riding: bool,
    /// Kernels with all of wgpu's runtime checks (a loop-bounding counter in every loop, and index clamps in the
    /// matrix-matrix products), which the engine leaves out natively
    #[arg(long)]
    pub checked_kernels: bool,
    /// Submit a decode step every N layers (0: the whole step in one submission)
    #[arg(long, default_value_t = 2)]
    pub layers_per_submit: usize,
    /// Decode without running each step ahead of its token's readback (the GPU then waits while the CPU reads
    /// each pick and records the next step)
    #[arg(long)]
    pub no_run_ahead: bool,
    /// Matrix-vector products take Q4_K blocks by 8 lanes of 32 values instead of 16 of 16 (as Q6_K's are)
    #[arg(long)]
    pub q4k_octets: bool,
    /// Matrix-vector products take rows of 8 Q4_K/Q6_K blocks or more four blocks side by side instead of two
    #[arg(long)]
    pub four_sides: bool,
    /// Matrix-vector products over Q4_K/Q6_K blocks by 8 lanes load each lane's next block before working through
    /// this one
    #[arg(long)]
    pub prefetch: bool,
}

pub fn run(model: &ModelPath, args: &BenchArgs, options: &EngineOptions) -> Result<(), String> {
    crate::gpu::matmul::set_big_tiles(!args.no_big_tiles);
    crate::gpu::matmul::set_split_target(args.split_target);
    crate::gpu::matmul::set_expert_tiles(args.expert_tiles.as_deref().map(crate::gpu::matmul::ExpertTiles::parse).transpose()?);
    crate::gpu::kernel::set_bind_cache(!args.no_bind_cache);
    crate::engine::set_layers_per_submit(args.layers_per_submit);
    matvec::set_engine_trial(args.q4k_octets, args.four_sides, args.prefetch);
    let prompts: Vec<usize> = list("--prompts", &args.prompts)?;
    let pools: Vec<f64> = list("--pools", &args.pools)?;
    let mut chunks: Vec<usize> = vec![1];
    let asked = args.chunks.clone().unwrap_or_else(|| format!("1,{}", crate::engine::DEFAULT_PREFILL_CHUNK));
    for c in list::<usize>("--chunks", &asked)? {
        if c == 0 {
            return Err("--chunks: a chunk holds at least one token".into());
        }
        if !chunks.contains(&c) {
            chunks.push(c);
        }
    }
    let longest = prompts.iter().max().copied().unwrap_or(0) + args.decode;
    let options = EngineOptions { n_ctx: Some(options.n_ctx.unwrap_or(0).max(longest)), stack_products: Some(!args.no_stacks), shared_rides: Some(!args.no_riding), ..options.clone() };
    let plan = BenchPlan { prompts, decode: args.decode, chunks, seed: args.seed };
    let mut rows: Vec<BenchRow> = Vec::new();
    // the floor's read rate on a device of its own, before a model is loaded: read beside a loaded model's buffers
    // the same read ran at 1.65 to 3.0 TB/s from one run to the next on the H100
    let bandwidth = pollster::block_on(async {
        let gpu = Gpu::new().await.map_err(|e| e.0)?;
        // a CPU adapter (SwiftShader, lavapipe) refused a 1 GiB buffer, and its "memory" is the host's anyway
        let bytes = if gpu.summary.device_type == "Cpu" { 64 << 20 } else { 1 << 30 };
        bench::read_bandwidth(&gpu, bytes, 10, 5).await
    })?;
    let mut modes: Vec<(String, Option<f64>)> = Vec::new();
    if !args.no_resident {
        modes.push(("resident".into(), None));
    }
    modes.extend(pools.iter().map(|&f| (format!("pool {:.0}%", 100.0 * f), Some(f))));
    for (i, (mode, fraction)) in modes.into_iter().enumerate() {
        let mut engine = match fraction {
            None => model.load(&EngineOptions { pool_bytes: None, gpu_budget_bytes: None, pool_slots: None, ..options.clone() })?,
            Some(f) => {
                // the engine's pool size comes from the fraction of all experts
                let probe = model.load(&EngineOptions { pool_slots: Some(0), ..options.clone() })?;
                let total = probe.config.moe_layers().count() as f64 * probe.config.n_expert as f64;
                drop(probe);
                model.load(&EngineOptions { pool_slots: Some((f * total).round() as u32), pool_bytes: None, gpu_budget_bytes: None, ..options.clone() })?
            }
        };
        if fraction.is_some() && !engine.is_streaming() {
            return Err(format!("{mode}: the pool holds every expert of this model: nothing to stream"));
        }
        if i == 0 && !args.json {
            eprintln!("{}; memory read {:.0} GB/s (measured here); {:.1} MB read per decode token at the least", engine.gpu.summary, bandwidth, engine.min_bytes_per_token() as f64 / 1e6);
        }
        engine.gpu.set_subgroups(!args.no_subgroups);
        engine.gpu.set_f16(!args.no_f16);
        engine.gpu.set_checked_kernels(args.checked_kernels);
        engine.set_run_ahead(!args.no_run_ahead);
        let before = rows.len();
        if args.profile {
            engine.gpu.start_profile();
        }
        if args.timeline {
            engine.gpu.start_timeline()?;
        }
        pollster::block_on(bench::run(&mut engine, &mode, &plan, Some(bandwidth), &mut rows))?;
        if !args.json {
            // the table so far, as each engine finishes (the header with the first)
            let table = bench::table(&rows);
            let lines: Vec<&str> = table.lines().collect();
            let start = if before == 0 { 0 } else { before + 1 };
            for line in &lines[start..] {
                println!("{line}");
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "bandwidthGBs": bandwidth, "rows": rows })).unwrap());
    } else {
        if args.profile {
            print!("{}", bench::profile_table(&rows, 40));
        }
        if args.timeline {
            print!("{}", bench::timeline_table(&rows, 40));
        }
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct BenchKernelsArgs {
    /// Products per measurement (after one warm-up)
    #[arg(long, default_value_t = 50)]
    pub reps: u32,
    /// Kernel variants to measure besides each matrix's default, comma-separated (r1i, r2i, r4i, r1m, r2m, r4m,
    /// r2in, r4in, r1i8, r2i8, r1i8q, r2i8q, r1i8qx4, r2i8qx4, r1i8x4, r2i8x4, r4i8, r4i8x4, r1i8qp, r2i8qp, r1i8qx4p, r2i8qx4p, r4is: rows per lane group, integer or magic
    /// conversion, n: one block at a time, 8: Q6_K blocks by 8 lanes, q: Q4_K blocks by 8 lanes too, x4: four
    /// blocks side by side, p: each lane's next block loaded ahead, s: x read as f32), or "all"
    #[arg(long, default_value = "")]
    pub variants: String,
    /// Print the rows as JSON
    #[arg(long)]
    pub json: bool,
    /// Measure only the reductions through workgroup memory, not also the subgroup ones
    #[arg(long)]
    pub no_subgroups: bool,
    /// Kernels with all of wgpu's runtime checks (a loop-bounding counter in every loop, and index clamps in the
    /// matrix-matrix products), which the engine leaves out natively
    #[arg(long)]
    pub checked_kernels: bool,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct KernelRow {
    product: String,
    variant: String,
    mb_per_product: f64,
    us_per_product: f64,
    gb_per_s: f64,
    share_of_read: f64,
    /// The same products recorded before the clock starts: the GPU's time (and one submission) only
    us_gpu_only: f64,
    gb_per_s_gpu_only: f64,
}

/// A row of `bytes` read per run in `secs` (recorded and run, run only), against the read rate `read` (GB/s).
fn kernel_row(product: &str, variant: String, bytes: u64, (secs, gpu_secs): (f64, f64), read: f64) -> KernelRow {
    KernelRow {
        product: product.into(),
        variant,
        mb_per_product: bytes as f64 / 1e6,
        us_per_product: 1e6 * secs,
        gb_per_s: bytes as f64 / secs / 1e9,
        share_of_read: bytes as f64 / secs / 1e9 / read,
        us_gpu_only: 1e6 * gpu_secs,
        gb_per_s_gpu_only: bytes as f64 / gpu_secs / 1e9,
    }
}

/// Bytes that look like weights to the kernels (any bit pattern decodes; speed does not depend on values).
fn filler(bytes: u64, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(bytes as usize);
    while (out.len() as u64) < bytes {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        out.extend_from_slice(&(state >> 16).to_le_bytes());
    }
    out.truncate(bytes as usize);
    out
}

/// Enough copies of a matrix that the rotation over them does not fit the GPU's caches (≥ 256 MB).
fn copies_for(bytes: u64, limit: u64) -> u64 {
    (256_000_000u64.div_ceil(bytes)).clamp(1, (limit / bytes).max(1))
}

/// Seconds per product: recorded and run (what an engine step pays), and run only (recorded beforehand).
async fn time_passes(gpu: &Gpu, reps: u32, probe: &wgpu::Buffer, mut record: impl FnMut(&mut Pass, u32)) -> Result<(f64, f64), String> {
    let mut warm = Pass::new();
    record(&mut warm, 0);
    warm.submit(gpu);
    gpu.read_back(probe, 4).await.map_err(|e| e.0)?;
    let began = crate::clock::now_s();
    let mut pass = Pass::new();
    for i in 0..reps {
        record(&mut pass, i);
    }
    pass.submit(gpu);
    gpu.read_back(probe, 4).await.map_err(|e| e.0)?;
    let with_recording = (crate::clock::now_s() - began) / reps as f64;
    let mut pass = Pass::new();
    for i in 0..reps {
        record(&mut pass, i);
    }
    let began = crate::clock::now_s();
    pass.submit(gpu);
    gpu.read_back(probe, 4).await.map_err(|e| e.0)?;
    Ok((with_recording, (crate::clock::now_s() - began) / reps as f64))
}

pub fn kernels(args: &BenchKernelsArgs) -> Result<(), String> {
    pollster::block_on(async {
        let gpu = Gpu::new().await.map_err(|e| e.0)?;
        gpu.set_checked_kernels(args.checked_kernels);
        let limits = gpu.device.limits();
        let limit = (limits.max_storage_buffer_binding_size as u64).min(limits.max_buffer_size);
        let read = bench::read_bandwidth(&gpu, 1 << 30, 20, 5).await?;
        let variants: Vec<matvec::Variant> = match args.variants.trim() {
            "" => Vec::new(),
            "all" => matvec::Variant::ALL.to_vec(),
            list => list.split(',').map(|v| matvec::Variant::parse(v.trim()).ok_or_else(|| format!("--variants: no variant {v:?}"))).collect::<Result<_, _>>()?,
        };
        let mut rows = vec![KernelRow { product: "memory read (baseline)".into(), variant: String::new(), mb_per_product: 0.0, us_per_product: 0.0, gb_per_s: read, share_of_read: 1.0, us_gpu_only: 0.0, gb_per_s_gpu_only: read }];
        // the default variant of each matrix first (None), then the ones asked for
        let variants: Vec<Option<matvec::Variant>> = std::iter::once(None).chain(variants.into_iter().map(Some)).collect();
        // each variant with subgroup reductions and without, where the device has them
        let subgroups: Vec<bool> = if gpu.subgroup_lanes().is_some() && !args.no_subgroups { vec![true, false] } else { vec![false] };
        let variants: Vec<(Option<matvec::Variant>, bool)> = variants.into_iter().flat_map(|v| subgroups.iter().map(move |&sg| (v, sg))).collect();
        let lanes = gpu.subgroup_lanes();
        let name_of = |(v, sg): (Option<matvec::Variant>, bool), m: Matrix| {
            let name = v.map(|v| v.name()).unwrap_or_else(|| format!("{}*", matvec::Variant::for_matrix(&gpu, m).name()));
            match (sg, lanes) {
                (true, Some(l)) => format!("{name} sg{l}"),
                _ => name,
            }
        };
        let row = |product: &str, v: String, bytes: u64, secs: (f64, f64)| kernel_row(product, v, bytes, secs, read);
        // (name, type, rows, cols): a product too small to cost anything but its dispatch (the floor under the
        // small ones), Ling 3.0 Flash's head, a KDA projection in and out, an expert's down rows
        let dense = [
            ("dispatch floor 256→1 Q4_K", GgmlType::Q4_K, 1u32, 256u32),
            ("head 2560→157184 Q6_K", GgmlType::Q6_K, 157184, 2560),
            ("attn_q 2560→4096 Q4_K", GgmlType::Q4_K, 4096, 2560),
            ("KDA in (stack) 2560→20512 Q4_K", GgmlType::Q4_K, 20512, 2560),
            ("shexp gate|up (stack) 2560→1536 Q4_K", GgmlType::Q4_K, 1536, 2560),
            ("attn_output 4096→2560 Q4_K", GgmlType::Q4_K, 2560, 4096),
            ("shared down 768→2560 Q6_K", GgmlType::Q6_K, 2560, 768),
        ];
        for (name, ty, n_rows, cols) in dense {
            let m = Matrix { ty, rows: n_rows, cols, byte_offset: 0 };
            let row_bytes = m.row_bytes() as u64;
            let bytes = n_rows as u64 * row_bytes;
            // a matrix above the binding limit is split into row ranges, one buffer each, as the engine does
            let rows_per_piece = (limit / row_bytes).min(n_rows as u64) as u32;
            let pieces: Vec<(u32, u32)> = (0..n_rows).step_by(rows_per_piece as usize).map(|r| (r, rows_per_piece.min(n_rows - r))).collect();
            let stride = (rows_per_piece as u64 * row_bytes).next_multiple_of(256);
            let copies = if pieces.len() > 1 { 1 } else { copies_for(stride, limit) };
            let buffers: Vec<wgpu::Buffer> = (0..pieces.len()).map(|i| gpu.upload("bench weights", &filler(stride * copies, 7 + i as u64))).collect();
            let x = gpu.upload("bench x", &(0..cols).flat_map(|_| 0.01f32.to_le_bytes()).collect::<Vec<u8>>());
            let y = gpu.storage_buffer("bench y", n_rows as u64 * 4);
            for &(v, sg) in &variants {
                gpu.set_subgroups(sg);
                let secs = time_passes(&gpu, args.reps, &y, |pass, i| {
                    for (&(first, rows), w) in pieces.iter().zip(&buffers) {
                        let m = Matrix { rows, byte_offset: (i as u64 % copies) * stride, ..m };
                        let v = v.unwrap_or(matvec::Variant::for_matrix(&gpu, m));
                        matvec::batched_as(v, &gpu, pass, w, m, 0, &x, Strided::at(0), &y, Strided::at(first), 1);
                    }
                })
                .await?;
                rows.push(row(name, name_of((v, sg), m), bytes, secs));
            }
        }
        // 8 selected experts' gate|up (Q4_K, 2×768 rows of 2560) and down (Q6_K, 2560 rows of 768) from a pool
        let (h, f, k) = (2560u32, 768u32, 8u32);
        let gate_up = Matrix { ty: GgmlType::Q4_K, rows: 2 * f, cols: h, byte_offset: 0 };
        let down = Matrix { ty: GgmlType::Q6_K, rows: h, cols: f, byte_offset: gate_up.rows as u64 * gate_up.row_bytes() as u64 };
        let record = down.byte_offset + h as u64 * down.row_bytes() as u64;
        let slot_bytes = record.next_multiple_of(256);
        let slots = (limit / slot_bytes).min(96) as u32;
        let pool = gpu.upload("bench pool", &filler(slot_bytes * slots as u64, 11));
        let table: Vec<u32> = (0..slots).collect();
        let table = gpu.upload("bench slots", bytemuck::cast_slice(&table));
        // a different set of k experts for every rep, so the pool is read, not the cache
        let sels: Vec<wgpu::Buffer> = (0..slots / k).map(|s| gpu.upload("bench sel", bytemuck::cast_slice(&(s * k..s * k + k).collect::<Vec<u32>>()))).collect();
        let x = gpu.upload("bench x", &vec![0u8; (k * 2 * f.max(h)) as usize * 4]);
        let y = gpu.storage_buffer("bench y", (k * 2 * f.max(h)) as u64 * 4);
        let chunk = PoolChunk { buffer: &pool, index: 0, slots_per_chunk: slots, slot_bytes };
        for (name, m, x_stride, y_stride) in [("experts gate|up 8×(2560→1536) Q4_K", gate_up, 0, 2 * f), ("experts down 8×(768→2560) Q6_K", down, f, h)] {
            for &(v, sg) in &variants {
                gpu.set_subgroups(sg);
                let secs = time_passes(&gpu, args.reps, &y, |pass, i| {
                    let sel = &sels[i as usize % sels.len()];
                    let v = v.unwrap_or(matvec::Variant::for_matrix(&gpu, m));
                    matvec::experts_as(v, &gpu, pass, chunk, m, sel, &table, 0, k, &x, Strided { offset: 0, stride: x_stride }, &y, Strided { offset: 0, stride: y_stride });
                })
                .await?;
                let bytes = k as u64 * m.rows as u64 * m.row_bytes() as u64;
                rows.push(row(name, name_of((v, sg), m), bytes, secs));
            }
        }
        gpu.set_subgroups(true);
        // the 8 experts' gate|up again, without the slot lookup (8 neighbouring slots as one batched product) and
        // without memory reads (the same 8 experts every rep, held in the GPU's L2): to tell what the expert product
        // costs from what its lookup and its reads cost
        let gate_up_bytes = k as u64 * gate_up.rows as u64 * gate_up.row_bytes() as u64;
        let secs = time_passes(&gpu, args.reps, &y, |pass, i| {
            let at = (i % (slots / k)) as u64 * k as u64 * slot_bytes;
            let m = Matrix { byte_offset: at, ..gate_up };
            matvec::batched(&gpu, pass, &pool, m, slot_bytes, &x, Strided { offset: 0, stride: 0 }, &y, Strided { offset: 0, stride: 2 * f }, k);
        })
        .await?;
        rows.push(row("8 slots' gate|up as a batched product", "batched".into(), gate_up_bytes, secs));
        let secs = time_passes(&gpu, args.reps, &y, |pass, _| {
            matvec::experts(&gpu, pass, chunk, gate_up, &sels[0], &table, 0, k, &x, Strided { offset: 0, stride: 0 }, &y, Strided { offset: 0, stride: 2 * f });
        })
        .await?;
        rows.push(row("experts gate|up, the same 8 each rep", "cached".into(), gate_up_bytes, secs));
        rows.extend(layer_kernels(&gpu, args.reps, read).await?);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        } else {
            println!("{}", gpu.summary);
            // "GPU only": the same products recorded before the clock started (no per-dispatch CPU cost)
            println!("{:<36} {:>12} {:>9} {:>10} {:>8} {:>8} {:>10} {:>8} {:>8}", "product", "variant", "MB", "µs", "GB/s", "of read", "µs GPU", "GB/s", "of read");
            for r in &rows {
                println!(
                    "{:<36} {:>12} {:>9.1} {:>10.1} {:>8.0} {:>7.0}% {:>10.1} {:>8.0} {:>7.0}%",
                    r.product, r.variant, r.mb_per_product, r.us_per_product, r.gb_per_s, 100.0 * r.share_of_read, r.us_gpu_only, r.gb_per_s_gpu_only, 100.0 * r.gb_per_s_gpu_only / read
                );
            }
        }
        Ok(())
    })
}

/// The small kernels of a decode step's MoE/KDA layer at Flash's widths, each timed as a chain of `reps` like the
/// products (what one costs beside "dispatch floor"): the norms, the router's choice, the KDA step, the router's
/// product with and without the FFN's norm in it.
async fn layer_kernels(gpu: &Gpu, reps: u32, read: f64) -> Result<Vec<KernelRow>, String> {
    let (hidden, n_expert, k) = (2560u32, 512u32, 8u32);
    let step = kda::StepLayout { n_head: 32, head_dim: 128, kernel_size: 4, fa_at: 3 * 4096, beta_at: 4 * 4096, z_at: 4 * 4096 + 32 };
    let dim = step.n_head * step.head_dim;
    let floats = |label: &str, n: u32| gpu.upload(label, &filler(n as u64 * 4, n as u64).chunks(4).flat_map(|b| (0.01 * (b[0] as f32 - 128.0) / 128.0).to_le_bytes()).collect::<Vec<u8>>());
    let (x, w, h) = (floats("x", hidden), floats("norm w", hidden), floats("h", hidden));
    let expert_out = floats("expert out", k * hidden);
    let shared = floats("shared", hidden);
    let logits = floats("router logits", n_expert);
    let bias = floats("router bias", n_expert);
    let sel = gpu.storage_buffer("selection", moe::selection_words(k) as u64 * 4);
    let mut words: Vec<u32> = (0..k).collect();
    words.extend((0..k).map(|_| 0.125f32.to_bits()));
    words.extend([0, 0]);
    let weights_sel = gpu.upload("selection", bytemuck::cast_slice(&words));
    let router = gpu.upload("router", &filler(n_expert as u64 * hidden as u64 * 4, 3).chunks(4).flat_map(|b| (0.001 * b[0] as f32).to_le_bytes()).collect::<Vec<u8>>());
    let router_m = Matrix { ty: GgmlType::F32, rows: n_expert, cols: hidden, byte_offset: 0 };
    let step_in = floats("step input", step.z_at + dim);
    let consts = floats("step constants", step.consts_floats());
    let conv = floats("conv state", 3 * dim * (step.kernel_size - 1));
    let state = floats("delta state", dim * step.head_dim);
    let out = gpu.storage_buffer("step out", dim as u64 * 4);
    let mut rows = Vec::new();
    let time = |name: &str, bytes: u64, secs: (f64, f64)| kernel_row(name, String::new(), bytes, secs, read);
    // what the floor is made of: the same tiny product written into one buffer every rep (wgpu puts a pipeline
    // barrier between writes of one storage buffer) and into a buffer of its own each rep (no barrier: the
    // dispatches may overlap)
    let tiny = Matrix { ty: GgmlType::Q4_K, rows: 1, cols: 256, byte_offset: 0 };
    let tiny_w = gpu.upload("tiny weights", &filler(tiny.row_bytes() as u64, 5));
    let tiny_x = floats("tiny x", 256);
    let outs: Vec<wgpu::Buffer> = (0..reps.min(256)).map(|_| gpu.storage_buffer("tiny y", 16)).collect();
    rows.push(time("dispatch floor, one output (barriers)", 0, time_passes(gpu, reps, &outs[0], |p, _| matvec::matvec(gpu, p, &tiny_w, tiny, &tiny_x, 0, &outs[0], 0)).await?));
    rows.push(time("dispatch floor, an output each (none)", 0, time_passes(gpu, reps, &outs[0], |p, i| matvec::matvec(gpu, p, &tiny_w, tiny, &tiny_x, 0, &outs[i as usize % outs.len()], 0)).await?));
    let hb = hidden as u64 * 4;
    rows.push(time("rms_norm 2560", 3 * hb, time_passes(gpu, reps, &h, |p, _| norm::rms_norm(gpu, p, &x, 0, &w, &h, 0, hidden, 1e-6)).await?));
    rows.push(time("moe_sum_norm 2560, 8 experts", (k as u64 + 4) * hb, time_passes(gpu, reps, &h, |p, _| norm::moe_sum_norm(gpu, p, &expert_out, &weights_sel, &shared, 0, k, &x, &w, &h, hidden, 1e-6)).await?));
    rows.push(time("moe_accumulate 2560, 8 experts", (k as u64 + 3) * hb, time_passes(gpu, reps, &h, |p, _| moe::accumulate(gpu, p, &expert_out, &weights_sel, &shared, &x, hidden, k)).await?));
    rows.push(time("moe_route 512 → 8 (8 groups, 4 kept)", 2 * n_expert as u64 * 4, time_passes(gpu, reps, &h, |p, _| moe::route(gpu, p, &logits, &bias, &sel, n_expert, k, 8, 4, true, 2.5)).await?));
    let state_bytes = 2 * dim as u64 * step.head_dim as u64 * 4;
    rows.push(time("kda_step 32×128", state_bytes, time_passes(gpu, reps, &h, |p, _| kda::step(gpu, p, &step_in, &consts, &conv, &state, &out, step, -5.0, 1e-6)).await?));
    let router_bytes = n_expert as u64 * hidden as u64 * 4;
    rows.push(time("router 2560→512 F32", router_bytes, time_passes(gpu, reps, &h, |p, _| matvec::matvec(gpu, p, &router, router_m, &h, 0, &logits, 0)).await?));
    let norm = matvec::Norm { w: &w, eps: 1e-6, out: &h };
    rows.push(time("router 2560→512 F32, with the norm", router_bytes, time_passes(gpu, reps, &h, |p, _| matvec::matvec_norm(gpu, p, &router, router_m, &x, 0, norm, &logits, 0)).await?));
    Ok(rows)
}
