// Package chunklink carries relocation state chunks from one node to
// another on a TCP connection of their own, beside Proto.Actor's remote
// (docs/PROTOCOL.md §5.3).
//
// Proto.Actor carries everything between two nodes on one ordered gRPC
// stream: a large payload there holds up every other message between the
// two nodes, and each chunk is copied by the marshal, gRPC's framing, its
// receive buffer and the unmarshal. On a link a chunk is written as a small
// header followed by the payload bytes it slices (no copy on the way out)
// and read into one buffer on the way in.
//
// A link is one-way and carries nothing but chunks: credits, relay-ready
// and every other message of the hand-off stay on Proto.Actor's
// connection, so a link adds no ordering the protocol relies on. Any
// failure of a connection (dial, handshake, write, a write stuck longer
// than WriteTimeout) drops what was queued on it and reports the peer
// lost; the driver resends on Proto.Actor's connection what the target
// did not credit, as after a lost Proto.Actor connection. The link is an
// optimization and never the only way a chunk can travel.
//
// Wire format (all integers big-endian): the dialer first writes Magic, a
// uint16 length and its node's Proto.Actor address (the address the
// target checks the move's source against); then frames, each a uint32
// header length (1..MaxHeaderBytes), a protobuf messages.RelocationState
// without its data, a uint32 data length (1..the listener's MaxData), the
// uint64 length of the whole stream the chunk is part of, and the data.
// The listener writes nothing back. With TLS, both ends present
// certificates of the cluster CA and the declared address must be on a
// host the dialer's certificate names.
//
// The listener reads the chunks of a move its node expects (Expect: the
// target accepted the move's Restore request) that come in order on a
// connection into one buffer of the whole stream's length, so that the
// target's assembler keeps that buffer instead of copying each chunk into
// its own (envelope.Chunk.Backing): each byte of it is written once,
// before the chunk holding it is delivered. The Restore request travels on
// the other connection and may come after the first chunks: a connection
// whose next chunk is of a move not expected yet waits for it up to
// ExpectWait (or until the node refuses the move) before reading the chunk
// into a buffer of its own. Nothing is
// allocated for a move the target did not accept beyond the chunk read,
// and buffers being filled are bounded by MaxInPlace.
package chunklink

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/ratelog"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Magic opens every link connection; its last digit is the wire version.
const Magic = "roam-chunk-link/1\n"

const (
	// MaxHeaderBytes bounds a frame's header (identity, index, offset).
	MaxHeaderBytes = 4 << 10
	// maxAddressBytes bounds the declared address in the opening.
	maxAddressBytes = 1 << 10
	// maxConns bounds the connections a listener serves at once: one per
	// peer node is the normal count, so this leaves room for restarts
	// and refuses a flood.
	maxConns = 1024
)

// Config configures a Link. Deliver is required; the rest have defaults.
type Config struct {
	// Listen is the host:port the link listens on ("host:0": a free port).
	Listen string
	// Advertise is the host:port peers dial, if not the listening address
	// (a port of 0 in it means the port the listener got).
	Advertise string
	// Self is this node's Proto.Actor address, declared to every peer.
	Self string
	// Server and Client, if set, make every connection mutual TLS: both
	// must be set together (the cluster's certificates and CA).
	Server, Client *tls.Config
	// Certified reports whether a TLS peer's certificate names the host of
	// the address it declares, and the node there. Required with TLS.
	Certified func(leaf *x509.Certificate, address string) bool
	// MaxData is the largest chunk accepted (the node's receive chunk
	// limit). Default 4 MiB.
	MaxData int
	// MaxInPlace bounds the bytes of whole-stream buffers the listener
	// fills at once (see the package comment). Default 256 MiB.
	MaxInPlace int64
	// ExpectWait is how long a connection waits for its next chunk's move
	// to be expected or refused. Default 250 ms.
	ExpectWait time.Duration
	// Deliver gets every chunk read, on the connection's goroutine, with
	// the address its dialer declared; whole, if not nil, is the buffer of
	// the whole stream m.Data lies in (envelope.Chunk.Backing). It must not
	// block for long: the connection reads nothing while it runs.
	Deliver func(from string, m *messages.RelocationState, whole []byte)
	// Lost is called when a connection to peer failed: chunks sent to it
	// since it was last reported may not have arrived.
	Lost func(peer string)
	// DialTimeout bounds a dial and its TLS handshake. Default 3 s.
	DialTimeout time.Duration
	// WriteTimeout bounds one frame's write: a peer that reads nothing
	// for this long (paused, or a full network path) is reported lost.
	// Default 10 s.
	WriteTimeout time.Duration
	Logger       zerolog.Logger
}

func (c *Config) validate() error {
	switch {
	case c.Deliver == nil:
		return fmt.Errorf("%w: chunk link: no Deliver", roamerr.ErrInvalidOperation)
	case (c.Server == nil) != (c.Client == nil):
		return fmt.Errorf("%w: chunk link: TLS needs both a server and a client configuration", roamerr.ErrInvalidOperation)
	case c.Server != nil && c.Certified == nil:
		return fmt.Errorf("%w: chunk link: TLS without a certificate check", roamerr.ErrInvalidOperation)
	case len(c.Self) == 0 || len(c.Self) > maxAddressBytes:
		return fmt.Errorf("%w: chunk link: own address %q", roamerr.ErrInvalidOperation, c.Self)
	}
	if _, _, err := net.SplitHostPort(c.Self); err != nil {
		return fmt.Errorf("%w: chunk link: own address %q: %w", roamerr.ErrInvalidOperation, c.Self, err)
	}
	if c.MaxData <= 0 {
		c.MaxData = 4 << 20
	}
	if c.MaxInPlace <= 0 {
		c.MaxInPlace = 256 << 20
	}
	if c.ExpectWait <= 0 {
		c.ExpectWait = 250 * time.Millisecond
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 3 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	return nil
}

// Link is one node's chunk link: a listener for peers' chunks and one
// connection to each peer it sends chunks to.
type Link struct {
	cfg       Config
	ln        net.Listener
	advertise string

	mu      sync.Mutex
	inPlace int64 // bytes of whole-stream buffers being filled
	// expected: the moves whose chunks are read in place, by sender and
	// identity, with their stream's length; expectedNow is closed (and
	// replaced) when one is added.
	expected    map[expectKey]uint64
	expectedNow chan struct{}
	// refusedMoves: moves the node refused, the latest maxRefused of them in
	// refusedOrder, whose chunks wait for nothing.
	refusedMoves map[expectKey]struct{}
	refusedOrder []expectKey
	peers        map[string]*peer // by link address
	conns        map[net.Conn]struct{}
	closed       bool
	wg           sync.WaitGroup
}

// refusedLog limits chunk_link_refused lines: anyone who can reach the
// port can open connections at will.
var refusedLog ratelog.Limiter

// Listen starts a link listening on cfg.Listen.
func Listen(cfg Config) (*Link, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("%w: chunk link: listen on %s: %w", roamerr.ErrUnavailable, cfg.Listen, err)
	}
	l := &Link{cfg: cfg, ln: ln, peers: map[string]*peer{}, conns: map[net.Conn]struct{}{},
		expected: map[expectKey]uint64{}, expectedNow: make(chan struct{}), refusedMoves: map[expectKey]struct{}{}}
	l.advertise = ln.Addr().String()
	if cfg.Advertise != "" {
		host, port, err := net.SplitHostPort(cfg.Advertise)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("%w: chunk link: advertised address %q: %w", roamerr.ErrInvalidOperation, cfg.Advertise, err)
		}
		if port == "0" || port == "" {
			port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		}
		l.advertise = net.JoinHostPort(host, port)
	}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

type expectKey struct{ from, id string }

func identityKey(id *messages.RelocationIdentity) string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(id)
	return string(b)
}

// Expect makes the chunks of the move id from the node at address from,
// of a stream of total bytes, read in place (see the package comment)
// until Forget.
func (l *Link) Expect(from string, id *messages.RelocationIdentity, total uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expected[expectKey{from, identityKey(id)}] = total
	close(l.expectedNow)
	l.expectedNow = make(chan struct{})
}

// maxRefused bounds the refused moves a link remembers.
const maxRefused = 4096

// Refuse tells the link its node refused the move id from from: a chunk of
// it waits no longer for the move to be expected.
func (l *Link) Refuse(from string, id *messages.RelocationIdentity) {
	k := expectKey{from, identityKey(id)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.refusedMoves[k]; ok {
		return
	}
	if len(l.refusedOrder) >= maxRefused {
		delete(l.refusedMoves, l.refusedOrder[0])
		l.refusedOrder = l.refusedOrder[1:]
	}
	l.refusedMoves[k] = struct{}{}
	l.refusedOrder = append(l.refusedOrder, k)
	close(l.expectedNow)
	l.expectedNow = make(chan struct{})
}

// Forget ends Expect.
func (l *Link) Forget(from string, id *messages.RelocationIdentity) {
	l.mu.Lock()
	delete(l.expected, expectKey{from, identityKey(id)})
	l.mu.Unlock()
}

// expecting returns the stream length of an expected move, waiting up
// to ExpectWait for it to be expected or refused.
func (l *Link) expecting(k expectKey) (uint64, bool) {
	var timeout <-chan time.Time
	for {
		l.mu.Lock()
		total, ok := l.expected[k]
		_, refused := l.refusedMoves[k]
		now, closed := l.expectedNow, l.closed
		l.mu.Unlock()
		if ok || refused || closed {
			return total, ok
		}
		if timeout == nil {
			t := time.NewTimer(l.cfg.ExpectWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-now:
		case <-timeout:
			return 0, false
		}
	}
}

// Address is the host:port peers dial.
func (l *Link) Address() string { return l.advertise }

// Close stops the listener, closes every connection and waits for the
// link's goroutines. Chunks still queued are dropped without a Lost
// report: the node is stopping.
func (l *Link) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.expectedNow)
	l.expectedNow = make(chan struct{})
	for c := range l.conns {
		c.Close()
	}
	for _, p := range l.peers {
		p.close()
	}
	l.mu.Unlock()
	l.ln.Close()
	l.wg.Wait()
}

func (l *Link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || len(l.conns) >= maxConns {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *Link) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	c.Close()
}

func (l *Link) accept() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or buffers: the next may succeed.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if !l.track(c) {
			c.Close()
			l.refused(c.RemoteAddr().String(), "too many connections")
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer l.untrack(c)
			if err := l.serve(c); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				l.refused(c.RemoteAddr().String(), err.Error())
			}
		}()
	}
}

func (l *Link) refused(remote, why string) {
	refusedLog.Warn(&l.cfg.Logger).Str("event", "chunk_link_refused").Str("remote", remote).Str("reason", ratelog.Clip(why)).
		Msg("a chunk link connection was closed")
}

// serve reads one connection's opening and frames until it ends.
func (l *Link) serve(c net.Conn) error {
	// The opening must arrive promptly; frames may come at any pace.
	_ = c.SetReadDeadline(time.Now().Add(l.cfg.DialTimeout))
	var conn net.Conn = c
	if l.cfg.Server != nil {
		tc := tls.Server(c, l.cfg.Server)
		if err := tc.Handshake(); err != nil {
			return fmt.Errorf("TLS handshake: %w", err)
		}
		conn = tc
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	from, err := readOpening(r)
	if err != nil {
		return err
	}
	if l.cfg.Server != nil {
		st := conn.(*tls.Conn).ConnectionState()
		if len(st.PeerCertificates) == 0 || !l.cfg.Certified(st.PeerCertificates[0], from) {
			return fmt.Errorf("the certificate does not name the host of %q, or the node there", from)
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	f := filling{link: l, from: from}
	defer f.release()
	for {
		m, whole, err := readFrame(r, l.cfg.MaxData, f.place)
		if err != nil {
			return err
		}
		l.cfg.Deliver(from, m, whole)
	}
}

// filling is the whole-stream buffer a connection fills in place: the
// identity whose chunks it holds and how far they came in order.
type filling struct {
	link *Link
	from string
	id   string // the identity's wire form
	buf  []byte
	high uint64 // every byte below is written; nothing below is written again
}

func (f *filling) release() {
	if f.buf != nil {
		f.link.mu.Lock()
		f.link.inPlace -= int64(len(f.buf))
		f.link.mu.Unlock()
	}
	f.id, f.buf, f.high = "", nil, 0
}

// place returns where a chunk of id at [off, off+n) of a total-byte
// stream is read to: its place in the connection's buffer for an expected
// move when it comes in order, else nil (a buffer of its own).
func (f *filling) place(m *messages.RelocationState, total, n uint64) []byte {
	id, off := identityKey(m.GetIdentity()), m.GetOffset()
	if f.id != id {
		f.release()
		// Whatever comes of it, the move's next chunks do not wait again.
		f.id = id
		if total == 0 || total > uint64(f.link.cfg.MaxInPlace) || off > total || n > total-off {
			return nil
		}
		if want, ok := f.link.expecting(expectKey{f.from, id}); !ok || want != total {
			return nil
		}
		f.link.mu.Lock()
		ok := f.link.inPlace+int64(total) <= f.link.cfg.MaxInPlace
		if ok {
			f.link.inPlace += int64(total)
		}
		f.link.mu.Unlock()
		if !ok {
			return nil
		}
		f.buf = make([]byte, total)
	}
	if f.buf == nil || uint64(len(f.buf)) != total || off < f.high || off > total || n > total-off {
		return nil
	}
	f.high = off + n
	buf := f.buf
	if f.high == total {
		// The last byte is placed: nothing more is written there, and a
		// chunk of this move again gets a buffer of its own.
		f.release()
		f.id = id
	}
	return buf
}

func readOpening(r *bufio.Reader) (string, error) {
	var head [len(Magic) + 2]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return "", fmt.Errorf("opening: %w", err)
	}
	if string(head[:len(Magic)]) != Magic {
		return "", errors.New("not a chunk link opening (or another wire version)")
	}
	n := int(binary.BigEndian.Uint16(head[len(Magic):]))
	if n == 0 || n > maxAddressBytes {
		return "", fmt.Errorf("declared address of %d bytes", n)
	}
	addr := make([]byte, n)
	if _, err := io.ReadFull(r, addr); err != nil {
		return "", fmt.Errorf("opening: %w", err)
	}
	if _, _, err := net.SplitHostPort(string(addr)); err != nil {
		return "", fmt.Errorf("declared address %q: %w", addr, err)
	}
	return string(addr), nil
}

// readFrame reads one frame; any malformed frame ends the connection.
// whole is the buffer m.Data lies in, if place (nil: none) put it in one:
// place gets the frame's header and lengths and returns the whole
// stream's buffer to read it into at its offset, or nil.
func readFrame(r *bufio.Reader, maxData int, place func(m *messages.RelocationState, total, n uint64) []byte) (m *messages.RelocationState, whole []byte, err error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, nil, err
	}
	hl := binary.BigEndian.Uint32(n[:])
	if hl == 0 || hl > MaxHeaderBytes {
		return nil, nil, fmt.Errorf("frame header of %d bytes", hl)
	}
	hdr, err := r.Peek(int(hl))
	if err != nil {
		return nil, nil, fmt.Errorf("frame header: %w", err)
	}
	m = &messages.RelocationState{}
	err = proto.Unmarshal(hdr, m)
	_, _ = r.Discard(int(hl))
	if err != nil {
		return nil, nil, fmt.Errorf("frame header: %w", err)
	}
	if len(m.GetData()) != 0 || m.GetIdentity() == nil {
		return nil, nil, errors.New("frame header carries data or no identity")
	}
	var lens [12]byte
	if _, err := io.ReadFull(r, lens[:]); err != nil {
		return nil, nil, fmt.Errorf("frame lengths: %w", err)
	}
	dl, total := uint64(binary.BigEndian.Uint32(lens[:4])), binary.BigEndian.Uint64(lens[4:])
	if dl == 0 || dl > uint64(maxData) {
		return nil, nil, fmt.Errorf("chunk of %d bytes (limit %d)", dl, maxData)
	}
	off := m.GetOffset()
	if place != nil {
		if whole = place(m, total, dl); whole != nil {
			m.Data = whole[off : off+dl : off+dl]
		}
	}
	if m.Data != nil {
		if _, err := io.ReadFull(r, m.Data); err != nil {
			return nil, nil, fmt.Errorf("frame data: %w", err)
		}
		return m, whole, nil
	}
	// A buffer of its own grows with what arrives: a length alone (from a
	// peer that then sends nothing) costs no more than 64 KiB.
	m.Data = make([]byte, 0, min(dl, 64<<10))
	for uint64(len(m.Data)) < dl {
		if len(m.Data) == cap(m.Data) {
			m.Data = append(m.Data, make([]byte, min(uint64(cap(m.Data)), dl-uint64(len(m.Data))))...)[:len(m.Data)]
		}
		n, err := r.Read(m.Data[len(m.Data):min(uint64(cap(m.Data)), dl)])
		m.Data = m.Data[:len(m.Data)+n]
		if err != nil && uint64(len(m.Data)) < dl {
			return nil, nil, fmt.Errorf("frame data: %w", err)
		}
	}
	return m, whole, nil
}

// Send queues m, a chunk of a stream of total bytes, for the peer whose
// Proto.Actor address is peer and whose link listens on linkAddr, and
// returns at once. m.Data is written as it
// is, later: the caller must not change it. A failure is reported through
// Config.Lost, never here.
func (l *Link) Send(peerAddr, linkAddr string, m *messages.RelocationState, total uint64) error {
	hdr, err := proto.Marshal(&messages.RelocationState{Identity: m.GetIdentity(), Index: m.GetIndex(), Offset: m.GetOffset()})
	if err != nil {
		return fmt.Errorf("%w: chunk header: %w", roamerr.ErrInvalidOperation, err)
	}
	if m.GetIdentity() == nil || len(hdr) > MaxHeaderBytes || len(m.GetData()) == 0 || uint64(len(m.GetData())) > 1<<32-1 {
		return fmt.Errorf("%w: chunk of %d bytes with a %d-byte header", roamerr.ErrInvalidOperation, len(m.GetData()), len(hdr))
	}
	head := make([]byte, 4+len(hdr)+12)
	binary.BigEndian.PutUint32(head, uint32(len(hdr)))
	copy(head[4:], hdr)
	binary.BigEndian.PutUint32(head[4+len(hdr):], uint32(len(m.GetData())))
	binary.BigEndian.PutUint64(head[8+len(hdr):], total)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("%w: chunk link closed", roamerr.ErrUnavailable)
	}
	p := l.peers[linkAddr]
	if p == nil || p.peerAddr != peerAddr {
		if p != nil {
			p.replaced = true
			p.close() // the link address now belongs to another node
		}
		p = &peer{link: l, peerAddr: peerAddr, linkAddr: linkAddr, wake: make(chan struct{}, 1), done: make(chan struct{}), broken: make(chan net.Conn, 1)}
		p.ctx, p.cancel = context.WithCancel(context.Background())
		l.peers[linkAddr] = p
		l.wg.Add(1)
		go p.run()
	}
	p.push(frame{head: head, data: m.GetData()})
	return nil
}

type frame struct{ head, data []byte }

// peer is the sending side of one connection, with one goroutine that
// dials when there is something to send and writes frames in order.
type peer struct {
	link               *Link
	peerAddr, linkAddr string
	wake               chan struct{}
	done               chan struct{}
	closeOnce          sync.Once
	replaced           bool // set before done is closed
	ctx                context.Context
	cancel             context.CancelFunc
	active             net.Conn // under mu: the connection, for close
	// broken gets a connection whose reader saw it end: the listener
	// never writes, so a read returns only when the connection is gone
	// (reset, or the peer closed it), perhaps with frames written to it
	// and never read.
	broken chan net.Conn

	mu    sync.Mutex
	queue []frame
	conn  net.Conn // only the run goroutine uses it
}

func (p *peer) push(f frame) {
	p.mu.Lock()
	p.queue = append(p.queue, f)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *peer) close() {
	p.closeOnce.Do(func() {
		close(p.done)
		p.cancel()
		p.mu.Lock()
		if p.active != nil {
			p.active.Close()
		}
		p.queue = nil
		p.mu.Unlock()
	})
}

// stopped: a replaced peer's chunks may not have arrived.
func (p *peer) stopped() {
	if p.replaced {
		p.lost(errors.New("its link address now belongs to another node"))
	}
}

func (p *peer) take() []frame {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.queue
	p.queue = nil
	return q
}

func (p *peer) run() {
	defer p.link.wg.Done()
	defer func() {
		if p.conn != nil {
			p.conn.Close()
		}
	}()
	for {
		select {
		case <-p.done:
			p.stopped()
			return
		case c := <-p.broken:
			if c == p.conn {
				p.lost(errors.New("the connection ended"))
			}
			continue
		case <-p.wake:
		}
		for q := p.take(); len(q) > 0; q = p.take() {
			if err := p.write(q); err != nil {
				select {
				case <-p.done:
					p.stopped()
					return // closing: not a lost peer
				default:
				}
				p.lost(err)
			}
		}
	}
}

// lost drops the connection and what is queued behind it and reports
// the peer.
func (p *peer) lost(err error) {
	if p.conn != nil {
		p.conn.Close()
		p.conn = nil
	}
	p.mu.Lock()
	p.active = nil
	p.mu.Unlock()
	p.take()
	p.link.cfg.Logger.Warn().Str("event", "chunk_link_lost").Str("peer", p.peerAddr).Str("link", p.linkAddr).Err(err).
		Msg("chunk link to a peer failed; the driver resends what was not credited on the Proto.Actor connection")
	if lost := p.link.cfg.Lost; lost != nil {
		lost(p.peerAddr)
	}
}

func (p *peer) write(q []frame) error {
	if p.conn == nil {
		c, err := p.dial()
		if err != nil {
			return err
		}
		p.mu.Lock()
		select {
		case <-p.done:
			p.mu.Unlock()
			c.Close()
			return net.ErrClosed
		default:
		}
		p.active = c
		p.mu.Unlock()
		p.conn = c
		p.link.wg.Add(1)
		go func() {
			defer p.link.wg.Done()
			var b [1]byte
			_, _ = c.Read(b[:])
			select {
			case p.broken <- c:
			case <-p.done:
			}
		}()
	}
	// One deadline per frame: a peer that keeps reading is never cut off
	// however long the queue.
	for _, f := range q {
		select {
		case <-p.done:
			return net.ErrClosed
		default:
		}
		_ = p.conn.SetWriteDeadline(time.Now().Add(p.link.cfg.WriteTimeout))
		bufs := net.Buffers{f.head, f.data}
		if _, err := bufs.WriteTo(p.conn); err != nil {
			return err
		}
	}
	return nil
}

func (p *peer) dial() (net.Conn, error) {
	cfg := p.link.cfg
	d := net.Dialer{Timeout: cfg.DialTimeout}
	c, err := d.DialContext(p.ctx, "tcp", p.linkAddr)
	if err != nil {
		return nil, err
	}
	conn := c
	if cfg.Client != nil {
		tc := tls.Client(c, clientFor(cfg.Client, p.linkAddr))
		_ = c.SetDeadline(time.Now().Add(cfg.DialTimeout))
		if err := tc.HandshakeContext(p.ctx); err != nil {
			c.Close()
			return nil, err
		}
		_ = c.SetDeadline(time.Time{})
		conn = tc
	}
	opening := make([]byte, 0, len(Magic)+2+len(cfg.Self))
	opening = append(opening, Magic...)
	opening = binary.BigEndian.AppendUint16(opening, uint16(len(cfg.Self)))
	opening = append(opening, cfg.Self...)
	_ = conn.SetWriteDeadline(time.Now().Add(cfg.WriteTimeout))
	if _, err := conn.Write(opening); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// clientFor verifies the listener's certificate for the host dialled.
func clientFor(base *tls.Config, addr string) *tls.Config {
	c := base.Clone()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		c.ServerName = host
	}
	return c
}
