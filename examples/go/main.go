// Command ratelimit serves HTTP and limits each client address to 10 requests per second (burst 20) with
// TB.ACQUIRE, answering 429 with Retry-After when a client is over its limit.
//
//	go run . -redis 127.0.0.1:6379 -listen 127.0.0.1:8080
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"net"
	"net/http"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// rateLimit takes cost tokens from the bucket at key and sets the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-11 for the limit named policy (mapped as docs/headers.md says). When it
// returns false it has already answered 429 Too Many Requests.
func rateLimit(ctx context.Context, rdb *redis.Client, w http.ResponseWriter, policy, key string, rate, burst, cost float64) (bool, error) {
	res, err := rdb.Do(ctx, "TB.ACQUIRE", key, rate, burst, cost).Int64Slice()
	if err != nil {
		return false, err // decide here whether an unreachable limiter fails open or closed
	}
	allowed, remaining, retryAfterMs, resetAfterMs := res[0], res[1], res[2], res[3]
	w.Header().Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", policy, int64(math.Floor(burst)), int64(math.Ceil(burst/rate))))
	w.Header().Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", policy, remaining, (resetAfterMs+999)/1000))
	if allowed == 1 {
		return true, nil
	}
	if retryAfterMs >= 0 { // -1: cost > burst, retrying never helps
		w.Header().Set("Retry-After", strconv.FormatInt((retryAfterMs+999)/1000, 10))
	}
	w.WriteHeader(http.StatusTooManyRequests)
	return false, nil
}

func main() {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "the Redis server with the module loaded")
	listen := flag.String("listen", "127.0.0.1:8080", "the address to serve HTTP on")
	flag.Parse()
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})

	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		client, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			client = r.RemoteAddr
		}
		ok, err := rateLimit(r.Context(), rdb, w, "client", "api:client:"+client, 10, 20, 1)
		if err != nil {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		if ok {
			w.Write([]byte("hello\n"))
		}
	})
	log.Printf("serving on http://%s, limits in Redis at %s", *listen, *redisAddr)
	log.Fatal(http.ListenAndServe(*listen, nil))
}
