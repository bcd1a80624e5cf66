package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// driver calls every counter by Spot ID through the nodes' HTTP endpoints,
// one goroutine per object (so an object that does not answer does not
// hold the others up), and moves counters between nodes continuously.
type driver struct {
	env    *env
	client *http.Client
	objs   []string

	mu          sync.Mutex
	ops         []Op
	lastOK      map[string]int64 // object → end of its latest successful request
	moves       int
	movesFailed int
	moveUntyped []string
	moveErrs    map[string]int

	stop    chan struct{}
	moving  sync.WaitGroup
	calling sync.WaitGroup
}

func newDriver(e *env) *driver {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	d := &driver{env: e, client: &http.Client{Transport: tr}, lastOK: map[string]int64{}, moveErrs: map[string]int{},
		stop: make(chan struct{})}
	for i := 0; i < e.set.Objects; i++ {
		d.objs = append(d.objs, fmt.Sprintf("c%02d", i))
	}
	return d
}

func (d *driver) start() {
	for i, o := range d.objs {
		d.calling.Add(1)
		go d.callLoop(o, uint64(i))
	}
	d.moving.Add(1)
	go d.moveLoop()
}

// finish stops the traffic and the mover and waits for them.
func (d *driver) finish() {
	close(d.stop)
	d.calling.Wait()
	d.moving.Wait()
}

func (d *driver) pick(rnd *rand.Rand) *node {
	up := d.env.upNodes()
	if len(up) == 0 {
		return nil
	}
	return up[rnd.IntN(len(up))]
}

func (d *driver) callLoop(obj string, seed uint64) {
	defer d.calling.Done()
	rnd := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	for seq := 1; ; seq++ {
		select {
		case <-d.stop:
			return
		case <-time.After(d.env.set.OpEvery):
		}
		n := d.pick(rnd)
		if n == nil {
			continue
		}
		d.call(n, obj, fmt.Sprintf("%s.%d", obj, seq), rnd.IntN(4) == 0)
	}
}

// call makes one call and keeps it in the history.
func (d *driver) call(n *node, obj, id string, send bool) Op {
	op := Op{ID: id, Obj: obj, Send: send, Entry: n.name, Start: time.Now().UnixNano()}
	q := url.Values{"obj": {obj}, "op": {id}}
	if send {
		q.Set("send", "1")
	}
	var res CallResult
	err := d.post(n, "/call", q, d.env.set.CallTimeout+5*time.Second, &res)
	op.End = time.Now().UnixNano()
	switch {
	case err != nil:
		op.Class, op.Err = "unreachable", err.Error()
	case res.OK:
		op.OK = true
	default:
		op.Class, op.Err = res.Class, res.Err
	}
	d.mu.Lock()
	d.ops = append(d.ops, op)
	if op.OK && !send {
		d.lastOK[obj] = op.End
	}
	d.mu.Unlock()
	return op
}

func (d *driver) post(n *node, path string, q url.Values, timeout time.Duration, out *CallResult) error {
	c := *d.client
	c.Timeout = timeout
	resp, err := c.PostForm("http://"+n.httpAddr+path, q)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}

func (d *driver) moveLoop() {
	defer d.moving.Done()
	rnd := rand.New(rand.NewPCG(99, uint64(time.Now().UnixNano())))
	for {
		select {
		case <-d.stop:
			return
		case <-time.After(d.env.set.MoveEvery):
		}
		to := d.pick(rnd)
		if to == nil {
			continue
		}
		d.move(rnd, d.objs[rnd.IntN(len(d.objs))], to.name)
	}
}

// move asks a node to move obj to the node named to; a node that does not
// own obj names the owner, which is asked in turn.
func (d *driver) move(rnd *rand.Rand, obj, to string) (CallResult, error) {
	via := d.pick(rnd)
	if via == nil {
		return CallResult{}, fmt.Errorf("no node up")
	}
	q := url.Values{"obj": {obj}, "to": {to}}
	limit := d.env.set.RestoreTimeout + 15*time.Second
	var res CallResult
	for hop := 0; hop < 3; hop++ {
		res = CallResult{}
		if err := d.post(via, "/move", q, limit, &res); err != nil {
			return res, err
		}
		if res.Class != "not_owner" {
			break
		}
		via = d.env.nodeByName(res.Owner)
		if via == nil || !via.isUp() {
			return res, nil
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case res.OK && !res.Same:
		d.moves++
	case res.OK, res.Class == "not_owner", res.Class == "no_target", res.Class == "no_owner":
	default:
		d.movesFailed++
		d.moveErrs[res.Class]++
		if res.Class == "untyped" {
			d.moveUntyped = append(d.moveUntyped, obj+" -> "+to+": "+res.Err)
		}
	}
	return res, nil
}

// servedSince reports whether every object answered a request with
// success after t.
func (d *driver) servedSince(t int64) (bool, []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var waiting []string
	for _, o := range d.objs {
		if d.lastOK[o] < t {
			waiting = append(waiting, o)
		}
	}
	return len(waiting) == 0, waiting
}

func (d *driver) counts() (ops, ok, moves int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, op := range d.ops {
		if op.OK {
			ok++
		}
	}
	return len(d.ops), ok, d.moves
}
