package bench

// The consumer benchmark's report: per contender the median over rounds of
// each figure, with its lowest and highest round, as a Markdown table, and
// the throughputs as an SVG chart.

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// spread formats the median of xs with its lowest and highest value.
func spread(xs []float64, f func(float64) string) string {
	if len(xs) == 0 {
		return "–"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return fmt.Sprintf("%s <sub>%s–%s</sub>", f(median(s)), f(s[0]), f(s[len(s)-1]))
}

// WriteMarkdown writes the consumer run's table: per contender the median
// messages per second, the median of per-round ratios to its broker's bare
// consumer, and CPU per message, each with the lowest and highest round.
func (rep *ConsumerReport) WriteMarkdown(w io.Writer) error {
	c := rep.Config
	var b strings.Builder
	fmt.Fprintf(&b, "Consumer end to end, run of %s on %s. One reader; %d rounds of %d messages per contender, contenders alternating; "+
		"%.0f%% of the messages repeat the key of one of the 200 before them (a redelivery); reads and idem batches of %d; "+
		"a handler that does nothing. Median over rounds, in small print the lowest and highest round; "+
		"CPU per message is a round's CPU divided by its messages: Redis's (INFO cpu), RabbitMQ's (its beam.smp, /proc/PID/stat, 10 ms ticks) "+
		"and this process's (getrusage).\n\n",
		rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Machine, c.Rounds, c.Msgs, 100*c.Redeliver, c.Batch)
	b.WriteString("| contender | msgs/s | ÷ bare | Redis CPU µs/msg | broker CPU µs/msg | client CPU µs/msg |\n|---|--:|--:|--:|--:|--:|\n")
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	ratio := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "×" }
	for _, r := range rep.Rows {
		redisCell := spread(r.RedisCPU, num)
		if r.Broker == "redis" {
			redisCell += " (stream and store)"
		}
		fmt.Fprintf(&b, "| **%s** | %s | %s | %s | %s | %s |\n", r.Name, spread(r.Rate, rate), spread(r.Ratio, ratio),
			redisCell, spread(r.BrokerCPU, num), spread(r.ClientCPU, num))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteSVG draws the consumer run as horizontal bars: median messages per
// second of each contender, its ratio to its broker's bare consumer
// written beside it.
func (rep *ConsumerReport) WriteSVG(w io.Writer) error {
	if len(rep.Rows) == 0 {
		return errors.New("bench: nothing to chart")
	}
	hi := 0.0
	for _, r := range rep.Rows {
		hi = math.Max(hi, median(slices.Clone(r.Rate)))
	}
	const (
		width, left, right, top, bar, gap = 960, 360, 140, 40, 22, 10
	)
	height := top + len(rep.Rows)*(bar+gap) + 50
	pw := float64(width - left - right)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="15">Consumer end to end: messages per second, one reader, %.0f%% redeliveries (median of %d rounds; ratio to the bare consumer)</text>`+"\n",
		100*rep.Config.Redeliver, rep.Config.Rounds)
	broker := ""
	for i, r := range rep.Rows {
		y := float64(top + i*(bar+gap))
		if r.Broker != broker {
			broker = r.Broker
		}
		color := "#7f7f7f"
		if r.Versus != "" {
			color = palette[0]
			if strings.Contains(r.Name, "batched") {
				color = palette[2]
			}
		}
		v := median(slices.Clone(r.Rate))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-8, y+bar*0.7, html.EscapeString(r.Name))
		fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="%s"/>`+"\n", left, y, v/hi*pw, bar, color)
		label := rate(v) + "/s"
		if len(r.Ratio) > 0 {
			label += fmt.Sprintf(" (%.2f×)", median(slices.Clone(r.Ratio)))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", float64(left)+v/hi*pw+6, y+bar*0.7, label)
	}
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#888888"/>`+"\n", left, left, top-4, height-46)
	fmt.Fprintf(&b, `<text x="10" y="%d" fill="#555555">%s</text>`+"\n", height-20, html.EscapeString(rep.Machine))
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
