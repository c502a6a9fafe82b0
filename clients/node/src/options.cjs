"use strict";
// The drop-ins' option check: every option a drop-in is given is one it implements, or it is refused at
// construction with an error naming it and saying why (a user switching from the library must never get a
// different limiter without a word).

const { TbArgumentError } = require("./errors.cjs");

/**
 * Throws a TbArgumentError for the first option of `options` that `known` does not list: with the reason from
 * `refused` when the library has that option and the drop-in cannot honour it, else as an unknown option.
 */
function checkOptions(owner, options, known, refused = {}) {
  for (const [name, value] of Object.entries(options)) {
    if (value === undefined || known.includes(name)) continue;
    if (Object.hasOwn(refused, name)) throw new TbArgumentError(`${owner} does not implement ${name}: ${refused[name]}`);
    throw new TbArgumentError(`${owner}: unknown option ${name} (it takes ${known.join(", ")})`);
  }
}

module.exports = { checkOptions };
