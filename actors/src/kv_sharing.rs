//! One K/V budget for the models that share this process's memory: the candle models
//! served here draw pages from one arena the size of their budgets together, so the
//! split follows demand (a routed pair rarely needs its small model's share).
//! llama.cpp contexts and remote models keep budgets of their own.

use tokenrouter_core::model::effective_kv_dtype;
use tokenrouter_core::model::{read_model_config, share_device_kv, share_kv, BackendKind, DeviceSpec, KvGeometry};

use crate::config::ModelSpec;
use crate::error::EngineError;
use crate::kv_manager::SharedPages;

/// Gives the local candle models among `models` one shared arena (when there are two
/// or more): their `load.shared_kv` is set, and the returned budget says how the
/// admission ledger counts it.
pub(crate) fn share_colocated_kv(
    models: &mut [ModelSpec],
    is_local: impl Fn(&ModelSpec) -> bool,
) -> Result<Option<SharedPages>, EngineError> {
    let candidates: Vec<usize> = (0..models.len())
        .filter(|&i| {
            let m = &models[i];
            is_local(m) && m.load.backend == BackendKind::Candle && m.load.shared_kv.is_none()
        })
        .collect();
    // One arena per memory: the device most of them run on (the CPU's RAM or one card's).
    let count_on = |d: DeviceSpec| candidates.iter().filter(|&&i| models[i].load.device == d).count();
    let Some(device) = candidates.iter().map(|&i| models[i].load.device).max_by_key(|&d| count_on(d)) else {
        return Ok(None);
    };
    let members: Vec<usize> = candidates.into_iter().filter(|&i| models[i].load.device == device).collect();
    if members.len() < 2 {
        return Ok(None);
    }
    let mut shapes = Vec::new();
    for &i in &members {
        let m = &models[i];
        // A folder that cannot be read fails to load later, with the loader's message.
        let Ok(config) = read_model_config(&m.path) else { return Ok(None) };
        let kv_dtype = effective_kv_dtype(&m.load).map_err(|e| EngineError::Config(e.to_string()))?;
        shapes.push((KvGeometry::new(&config, m.load.block_size, kv_dtype), m.load.prefix_cache));
    }
    let budget: usize = members.iter().map(|&i| models[i].load.kv_budget_bytes).sum();
    let shared = if device.is_cuda() { share_device_kv(&shapes, budget) } else { share_kv(&shapes, budget) };
    let (total, page_bytes) = shared.first().map_or((0, 0), |s| (s.arena.pages(), s.arena.page_floats() * 4));
    if total == 0 {
        return Err(EngineError::Config(format!("a shared KV budget of {budget} bytes holds not one page")));
    }
    let mut pages = SharedPages { total, members: Vec::new() };
    for (&i, kv) in members.iter().zip(shared) {
        pages.members.push((i, models[i].load.block_size, kv.pool.pages_per_block()));
        models[i].load.shared_kv = Some(kv);
    }
    tracing::info!(
        models = members.len(),
        mib = budget >> 20,
        pages = total,
        page_bytes,
        %device,
        "colocated models share one KV budget"
    );
    Ok(Some(pages))
}
