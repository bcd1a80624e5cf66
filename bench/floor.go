package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
)

// casProbe times one compare-and-set on a world's store done as cheaply
// as that store allows: the store part of a move's floor (a move's pause
// holds three one-way hops and the target's one owner CAS). close ends
// what the probe holds (its own Consul client).
type casProbe struct {
	once  func(ctx context.Context) (time.Duration, error)
	close func()
}

// newCASProbe is a probe of s beside the record of key (which it copies,
// so the probe writes a value of the same size). On Consul it is a raw
// transaction sent with Consul's own client to the same agent: no roam
// encoding, batching or checks. On any other store it is the store's own
// CompareAndSet, on a key of its own.
func newCASProbe(ctx context.Context, s location.Store, key location.AuthorityKey) (casProbe, error) {
	if c, ok := s.(*consulClients); ok {
		return rawConsulCAS(c.cfg.Address, c.cfg.Prefix, key.ID)
	}
	v, err := s.Read(ctx, key)
	if err != nil {
		return casProbe{}, fmt.Errorf("floor probe: read %s: %w", key, err)
	}
	rec := proto.Clone(v.Record).(*location.Record)
	probe := location.Key(key.Kind, key.ID+"-floor")
	at, err := s.CompareAndSet(ctx, probe, 0, rec)
	if err != nil {
		return casProbe{}, fmt.Errorf("floor probe: create: %w", err)
	}
	return casProbe{once: func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		next, err := s.CompareAndSet(ctx, probe, at, rec)
		d := time.Since(start)
		at = next
		return d, err
	}, close: func() {}}, nil
}

// rawConsulCAS is a check-and-set transaction on a copy of the record of
// the object id under prefix, as BenchmarkRawTxnCAS sends it.
func rawConsulCAS(address, prefix, id string) (casProbe, error) {
	transport := http.DefaultTransport.(*http.Transport).Clone() // its own, closed with the probe
	client, err := api.NewClient(&api.Config{Address: address, Transport: transport})
	if err != nil {
		return casProbe{}, err
	}
	pairs, _, err := client.KV().List(prefix+"/loc/", nil)
	if err != nil {
		return casProbe{}, fmt.Errorf("floor probe: list: %w", err)
	}
	var value []byte
	for _, p := range pairs {
		if strings.HasSuffix(p.Key, "/"+id) {
			value = p.Value
		}
	}
	if value == nil {
		return casProbe{}, fmt.Errorf("floor probe: no record of %s under %s", id, prefix)
	}
	key := prefix + "/floor/" + id
	if _, err := client.KV().Put(&api.KVPair{Key: key, Value: value}, nil); err != nil {
		return casProbe{}, fmt.Errorf("floor probe: create: %w", err)
	}
	kv, _, err := client.KV().Get(key, nil)
	if err != nil || kv == nil {
		return casProbe{}, fmt.Errorf("floor probe: read back: %v", err)
	}
	index := kv.ModifyIndex
	return casProbe{once: func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		ok, resp, _, err := client.Txn().Txn(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: key, Value: value, Index: index}}}, (&api.QueryOptions{}).WithContext(ctx))
		d := time.Since(start)
		if err != nil || !ok {
			return d, fmt.Errorf("floor probe: raw CAS: ok %v, %v", ok, err)
		}
		index = resp.Results[0].KV.ModifyIndex
		return d, nil
	}, close: transport.CloseIdleConnections}, nil
}
