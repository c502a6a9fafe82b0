// The ESM entry's declarations: the same exports as the CommonJS entry.
export * from "./index.js";
import * as tb from "./index.js";
export default tb;
