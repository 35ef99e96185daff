// Command nc is the netcat of the agnhost test image equivalent (tests/conformance/images.py).
//
// Upstream's agnhost image has netcat-openbsd; the e2e suite sends UDP with it (`echo
// hostName | nc -w 1 -u HOST PORT`, printing the reply), which Debian's busybox nc cannot
// do. This is that UDP client: it sends standard input as one datagram and prints every
// datagram that comes back until nothing has arrived for -w seconds (forever without -w).
// Without -u it runs busybox's nc applet with the same arguments, under the name nd that
// the image gives it (busybox's shell would otherwise run its applet instead of this nc).
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	args := os.Args[1:]
	udp := false
	var wait time.Duration
	var operands []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-u":
			udp = true
		case a == "-w" && i+1 < len(args):
			i++
			wait = seconds(args[i])
		case strings.HasPrefix(a, "-w") && len(a) > 2:
			wait = seconds(a[2:])
		case a == "-v" || a == "-n":
		default:
			operands = append(operands, a)
		}
	}
	if !udp {
		err := syscall.Exec("/bin/busybox", append([]string{"nd"}, args...), os.Environ())
		fail("exec busybox nc: %v", err)
	}
	if len(operands) != 2 {
		fail("usage: nc [-w SECONDS] -u HOST PORT")
	}
	conn, err := net.Dial("udp", net.JoinHostPort(operands[0], operands[1]))
	if err != nil {
		fail("%v", err)
	}
	payload, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("reading stdin: %v", err)
	}
	if _, err := conn.Write(payload); err != nil {
		fail("%v", err)
	}
	buf := make([]byte, 65536)
	for {
		if wait > 0 {
			if err := conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
				fail("%v", err)
			}
		}
		n, err := conn.Read(buf)
		if err != nil {
			if e, ok := err.(net.Error); ok && e.Timeout() {
				return
			}
			fail("%v", err)
		}
		if _, err := os.Stdout.Write(buf[:n]); err != nil {
			fail("%v", err)
		}
	}
}

func seconds(s string) time.Duration {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		fail("invalid wait %q", s)
	}
	return time.Duration(n) * time.Second
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "nc: "+format+"\n", a...)
	os.Exit(1)
}
