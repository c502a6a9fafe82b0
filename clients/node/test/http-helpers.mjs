// Shared by the HTTP tests: start an app on a free loopback port, and read the rate-limit headers of a response.
export async function listen(server) {
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${server.address().port}`;
}

export function closeServer(server) {
  server.closeAllConnections?.();
  return new Promise((resolve) => server.close(resolve));
}

export function limitHeaders(response) {
  const names = ["ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "retry-after"];
  return Object.fromEntries(names.filter((name) => response.headers.has(name)).map((name) => [name, response.headers.get(name)]));
}
