package consulstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/roamactors/roam/location"
)

// Capacity slots (location.Slot) are keys under <prefix>/slots/, one per
// held slot, locked by the session of the node's owner lease: Consul
// deletes them when the session ends (behaviour delete), as it deletes
// the node's descriptor. Their values are readable JSON, so that
// `consul kv get -recurse <prefix>/slots/` shows who holds what.

// slotValue is a slot's stored value.
type slotValue struct {
	HolderKind string `json:"holder_kind"`
	HolderID   string `json:"holder_id"`
	Pending    bool   `json:"pending"`
}

func encodeSlot(holder location.AuthorityKey, pending bool) ([]byte, error) {
	return json.Marshal(slotValue{HolderKind: location.KindName(holder.Kind), HolderID: holder.ID, Pending: pending})
}

// decodeSlot reads the slot stored at pair, whose key ends in its index.
func (s *Store) decodeSlot(node location.NodeKey, pair *api.KVPair) (location.Slot, error) {
	bad := func(why string, err error) (location.Slot, error) {
		return location.Slot{}, fmt.Errorf("%w: key %s holds no capacity slot: %s: %v", location.ErrInvalid, pair.Key, why, err)
	}
	index, err := strconv.ParseUint(strings.TrimPrefix(pair.Key, s.slotPrefix(node)), 10, 32)
	if err != nil {
		return bad("index", err)
	}
	var v slotValue
	if err := json.Unmarshal(pair.Value, &v); err != nil {
		return bad("value", err)
	}
	kind, ok := kindNamed(v.HolderKind)
	if !ok {
		return bad("holder kind", fmt.Errorf("unknown kind %q", v.HolderKind))
	}
	return location.Slot{Index: uint32(index), Holder: location.Key(kind, v.HolderID), Pending: v.Pending}, nil
}

// kindNamed is the kind location.KindName calls name.
func kindNamed(name string) (location.Kind, bool) {
	for _, k := range location.Kinds {
		if location.KindName(k) == name {
			return k, true
		}
	}
	return 0, false
}

// ListSlots implements location.Store.
func (s *Store) ListSlots(ctx context.Context, node location.NodeKey) ([]location.Slot, error) {
	if err := node.Validate(); err != nil {
		return nil, err
	}
	var pairs api.KVPairs
	var meta *api.QueryMeta
	err := s.on(ctx, readCall, func(ctx context.Context, c *api.Client) (err error) {
		pairs, meta, err = c.KV().List(s.slotPrefix(node), s.consistent(ctx))
		return err
	})
	if err != nil {
		return nil, classify("list slots", err, false)
	}
	if err := filtered("list slots", meta); err != nil {
		return nil, err
	}
	out := make([]location.Slot, 0, len(pairs))
	for _, p := range pairs {
		slot, err := s.decodeSlot(node, p)
		if err != nil {
			return nil, err
		}
		out = append(out, slot)
	}
	location.SortSlots(out)
	return out, nil
}
