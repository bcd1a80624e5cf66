package meshnode_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
)

// Requests between two nodes make no HTTP/2 pings: the remote's
// flow-control window is fixed, so gRPC's bandwidth estimator, which
// pings for every burst of data it reads, is off. With it on, every round
// trip added a ping and its acknowledgement to the two data frames (a
// quarter of a move's CPU went to the socket writes, `make bench` (g)).
func TestRequestsBetweenNodesMakeNoFlowControlPings(t *testing.T) {
	store := memstore.New()
	frames := &frameCounter{preface: len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")}
	// WithDialOptions replaces the dial options it is given after, plain
	// TCP's credentials included.
	dial := remote.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &countedConn{Conn: c, frames: frames}, nil
	}))
	a, err := meshnode.Start(context.Background(), meshnode.Config{Store: store, RemoteOptions: []remote.ConfigOption{dial}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	b, err := meshnode.Start(context.Background(), meshnode.Config{Store: store})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	_, err = b.System().Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if s, ok := c.Message().(*wrapperspb.StringValue); ok {
			c.Respond(s)
		}
	}), "echo")
	require.NoError(t, err)

	echo := actor.NewPID(b.System().Address(), "echo")
	const requests = 300
	for i := 0; i < requests; i++ {
		_, err := a.System().Root.RequestFuture(echo, wrapperspb.String("ping?"), testwait.Patience(t)).Result()
		require.NoError(t, err)
	}
	data, pings := frames.counts()
	require.GreaterOrEqual(t, data, requests, "the requests were counted as they went")
	// Keepalive may ping once or twice; the estimator pinged about once a
	// round trip.
	require.Less(t, pings, 5, "PING frames written by the requesting node for %d requests", requests)
}

// countedConn counts the HTTP/2 frames written on a client connection.
type countedConn struct {
	net.Conn
	frames *frameCounter
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.frames.write(p)
	return c.Conn.Write(p)
}

// frameCounter parses the frame headers of an HTTP/2 client's byte
// stream, written in pieces of any size: the preface, then frames of a
// 9-byte header (length, type, flags, stream) and a payload.
type frameCounter struct {
	mu          sync.Mutex
	preface     int // bytes of the preface still to skip
	skip        int // payload bytes of the current frame still to skip
	hdr         []byte
	data, pings int
}

func (f *frameCounter) write(p []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(p) > 0 {
		switch {
		case f.preface > 0:
			n := min(f.preface, len(p))
			f.preface, p = f.preface-n, p[n:]
		case f.skip > 0:
			n := min(f.skip, len(p))
			f.skip, p = f.skip-n, p[n:]
		default:
			n := min(9-len(f.hdr), len(p))
			f.hdr, p = append(f.hdr, p[:n]...), p[n:]
			if len(f.hdr) < 9 {
				continue
			}
			switch f.hdr[3] {
			case 0x0:
				f.data++
			case 0x6:
				f.pings++
			}
			f.skip = int(f.hdr[0])<<16 | int(f.hdr[1])<<8 | int(f.hdr[2])
			f.hdr = f.hdr[:0]
		}
	}
}

func (f *frameCounter) counts() (data, pings int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.data, f.pings
}
