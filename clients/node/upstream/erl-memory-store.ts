// Adapter for express-rate-limit's suite (copied over its source/memory-store.ts by run.mjs): its default store
// is redis-tb's TbStore on the server run.mjs started. Only construction differs: a fresh prefix per store, and a
// bucket of 1000 when init() is given no limit (the memory-store tests call init({ windowMs }) alone).
import { createRequire } from 'node:module'
import type { Options, Store } from './types.js'

const require = createRequire(import.meta.url)
const pkg = process.env.REDIS_TB_PACKAGE as string
const { TbStore } = require(`${pkg}/src/index.cjs`)
const { Redis } = require(`${pkg}/node_modules/ioredis`)

let redis: any
let counter = 0

export class MemoryStore extends (TbStore as any) implements Store {
	constructor(_validations?: unknown) {
		redis ??= new Redis({ port: Number(process.env.REDIS_TB_PORT), host: '127.0.0.1' })
		counter += 1
		super({ client: redis, prefix: `erl:${process.pid}:${Date.now()}:${counter}:` })
	}

	init(options: Options) {
		if (typeof options.limit !== 'number') this._burst = 1000
		super.init(options)
	}

	shutdown() {}
}
