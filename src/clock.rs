//! Seconds on a monotonic clock, for rates and time splits (`std::time::Instant` panics on wasm32-unknown-unknown,
//! so the browser uses `performance.now()`).

#[cfg(not(target_arch = "wasm32"))]
pub fn now_s() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

#[cfg(target_arch = "wasm32")]
pub fn now_s() -> f64 {
    use wasm_bindgen::JsCast;
    let performance = js_sys::Reflect::get(&js_sys::global(), &"performance".into()).ok();
    let now = performance.as_ref().and_then(|p| {
        let f = js_sys::Reflect::get(p, &"now".into()).ok()?.dyn_into::<js_sys::Function>().ok()?;
        f.call0(p).ok()?.as_f64()
    });
    now.unwrap_or_else(js_sys::Date::now) / 1000.0
}
