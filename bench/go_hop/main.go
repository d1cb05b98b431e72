// A stand-in for the collections service written in Go (issue 41): the same WebSocket
// protocol (o41.collections.v2) for a dict's strong get and set only, each one etcd call
// from etcd's own Go client, no tenants, no quota, no owners. It measures what the
// one-worker rows would cost if the service's request path were not Python: the sky
// client's hop plus Go's etcd call. Driven by bench/go_hop.py; never a product part.
//
//	go-hop LISTEN_ADDR ETCD_ENDPOINT
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/coder/websocket"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type message struct {
	ID      json.RawMessage `json:"id"`
	Compute string          `json:"compute"`
	Kind    string          `json:"kind"`
	Name    string          `json:"name"`
	Op      string          `json:"op"`
	Args    struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"args"`
}

type answer struct {
	ID     json.RawMessage `json:"id"`
	Status int             `json:"status"`
	Result any             `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

func perform(ctx context.Context, cli *clientv3.Client, m *message) answer {
	key := "/o41-go-hop/" + m.Compute + "/" + m.Kind + "/" + m.Name + "/e/" + m.Args.Key
	switch {
	case m.Kind == "dict" && m.Op == "set":
		if _, err := cli.Put(ctx, key, m.Args.Value); err != nil {
			return answer{ID: m.ID, Status: 503, Error: err.Error()}
		}
		return answer{ID: m.ID, Status: 200, Result: map[string]any{}}
	case m.Kind == "dict" && m.Op == "get":
		got, err := cli.Get(ctx, key) // linearizable, as a strong get
		if err != nil {
			return answer{ID: m.ID, Status: 503, Error: err.Error()}
		}
		if len(got.Kvs) == 0 {
			return answer{ID: m.ID, Status: 200, Result: map[string]any{"found": false, "value": nil}}
		}
		return answer{ID: m.ID, Status: 200, Result: map[string]any{"found": true, "value": string(got.Kvs[0].Value)}}
	}
	return answer{ID: m.ID, Status: 400, Error: fmt.Sprintf("the Go stand-in has no %s.%s", m.Kind, m.Op)}
}

func main() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Args[2], ","), DialTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	http.HandleFunc("/v1/collections", func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"o41.collections.v2"}})
		if err != nil {
			return
		}
		defer conn.CloseNow()
		ctx := r.Context()
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			var m message
			var a answer
			if err := json.Unmarshal(data, &m); err != nil {
				a = answer{Status: 400, Error: "not a JSON object"}
			} else {
				a = perform(ctx, cli, &m)
			}
			out, _ := json.Marshal(a)
			if err := conn.Write(ctx, websocket.MessageText, out); err != nil {
				return
			}
		}
	})
	fmt.Println("ready")
	if err := http.ListenAndServe(os.Args[1], nil); err != nil {
		panic(err)
	}
}
