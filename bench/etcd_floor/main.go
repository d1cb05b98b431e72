// Sequential puts and gets with etcd's own Go client on one connection: p50 and p99 of
// three rounds of 1,000 each, the floor of a strong write or read (issue 41), driven by
// bench/etcd_floor.py beside the service's own client.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func pct(d []time.Duration, p float64) float64 {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[int(float64(len(d)-1)*p)].Microseconds()) / 1000
}

func main() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Args[1], ","), DialTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	ctx := context.Background()
	val := strings.Repeat("v", 64)
	for round := 0; round < 3; round++ {
		var puts, gets []time.Duration
		for i := 0; i < 1000; i++ {
			s := time.Now()
			if _, err := cli.Put(ctx, fmt.Sprintf("/bench/k%d", i%50), val); err != nil {
				panic(err)
			}
			puts = append(puts, time.Since(s))
			s = time.Now()
			if _, err := cli.Get(ctx, fmt.Sprintf("/bench/k%d", i%50)); err != nil {
				panic(err)
			}
			gets = append(gets, time.Since(s))
		}
		fmt.Printf("go client  put p50 %.3f ms p99 %.3f ms | get p50 %.3f ms p99 %.3f ms\n", pct(puts, 0.5), pct(puts, 0.99), pct(gets, 0.5), pct(gets, 0.99))
	}
}
