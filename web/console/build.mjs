// Builds the console into internal/console/dist (or the directory given as
// the first argument): app.js and app.css bundled by esbuild, index.html
// copied. The output depends only on the sources and the locked packages,
// so scripts/console.sh can check that the committed dist is what this
// produces.
import * as esbuild from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] || join(here, "../../internal/console/dist"));
mkdirSync(out, { recursive: true });
const common = { bundle: true, minify: true, legalComments: "eof", logLevel: "warning", absWorkingDir: here };
await esbuild.build({ ...common, entryPoints: ["src/main.ts"], outfile: join(out, "app.js"), format: "iife", target: "es2020" });
await esbuild.build({ ...common, entryPoints: ["src/style.css"], outfile: join(out, "app.css") });
copyFileSync(join(here, "src/index.html"), join(out, "index.html"));
