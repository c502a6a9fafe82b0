// The ESM entry: the CommonJS implementation's exports, so that `import` and `require` share one copy (no dual
// package hazard: a TbClient made by one is an instance for the other). Node finds the named exports by reading
// index.cjs's `module.exports = { ... }`, so every export there is a plain name; the default export is that object.
export * from "./index.cjs";
export { default } from "./index.cjs";
