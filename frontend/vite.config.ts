/// <reference types="vitest/config" />
import { defineConfig } from "vite";

// Built files are served by Django: index.html for every console route, assets under /static/
// (STATICFILES_DIRS points at frontend/dist; collectstatic copies them to STATIC_ROOT).
export default defineConfig({
  base: "/static/",
  esbuild: { jsx: "automatic" },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    sourcemap: false,
    chunkSizeWarningLimit: 400,
    rollupOptions: {
      onwarn(warning, warn) {
        // react-router ships "use client" directives, meaningless in a client-only bundle.
        if (warning.code === "MODULE_LEVEL_DIRECTIVE") return;
        warn(warning);
      },
    },
  },
  // The console carries examples/completion.py ("Try an example"): the repository root is readable.
  server: { proxy: { "/api": "http://127.0.0.1:8000" }, fs: { allow: [".."] } },
  test: {
    environment: "jsdom",
    globals: true,
    include: ["src/**/*.test.{ts,tsx}"],
    setupFiles: ["src/test/setup.ts"],
    // Rendering 100-row tables in jsdom takes seconds on a loaded CI machine; 5 s flaked.
    testTimeout: 15000,
  },
});
