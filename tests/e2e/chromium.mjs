// Headless Chromium with WebGPU on SwiftShader (no GPU needed), driven by Playwright with the system browser.
import { chromium } from "playwright-core";

export const CHROMIUM_ARGS = [
  "--headless=new", "--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--enable-unsafe-webgpu", "--enable-features=Vulkan",
  "--use-vulkan=swiftshader", "--use-webgpu-adapter=swiftshader", "--use-angle=swiftshader",
];

export async function launch() {
  return chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", args: CHROMIUM_ARGS, headless: true });
}
