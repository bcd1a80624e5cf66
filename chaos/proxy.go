package chaos

import (
	"io"
	"net"
	"sync"
)

// proxy is a TCP proxy the test owns in front of a node's remote port; the
// node advertises the proxy's address, so every peer reaches it through
// here. Cut is a partition: no byte passes in either direction on the
// connections it carries, and new connections are accepted but not
// forwarded; nothing is closed, so the peers see silence, not a reset.
// Heal lets everything through again, held bytes and connections first.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	cut   bool
	conns map[net.Conn]struct{}
}

func newProxy(listen, target string) (*proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	return p, nil
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

// wait blocks while the proxy is cut.
func (p *proxy) wait() {
	p.mu.Lock()
	for p.cut {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

type gated struct {
	p *proxy
	w io.Writer
}

func (g gated) Write(b []byte) (int, error) {
	g.p.wait()
	return g.w.Write(b)
}

func (p *proxy) pipe(c net.Conn) {
	p.wait()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(gated{p, up}, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(gated{p, c}, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// Cut stops every byte.
func (p *proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
}

// Heal lets bytes through again.
func (p *proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Close stops the proxy and closes its connections.
func (p *proxy) Close() {
	p.ln.Close()
	p.Heal()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}
