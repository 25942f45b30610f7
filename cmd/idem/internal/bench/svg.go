package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// palette gives each line its colour; past its length, colours repeat with
// a dash pattern, so lines stay told apart.
var palette = []string{
	"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
	"#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8",
}

// WriteSVG draws throughput (median messages per second) against
// goroutines, one line per contender, both axes logarithmic: the
// contenders span three orders of magnitude (Postgres to an in-process
// handler), which a linear axis would flatten. It needs at least one row.
func (rep *Report) WriteSVG(w io.Writer) error {
	gs := rep.Config.Goroutines
	if len(rep.Rows) == 0 || len(gs) == 0 {
		return fmt.Errorf("bench: nothing to chart")
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rep.Rows {
		for _, t := range r.Throughput {
			if t > 0 {
				lo, hi = math.Min(lo, t), math.Max(hi, t)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	yLo, yHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yHi == yLo {
		yHi++
	}
	xLo, xHi := math.Log2(float64(gs[0])), math.Log2(float64(gs[len(gs)-1]))
	for _, g := range gs {
		xLo, xHi = math.Min(xLo, math.Log2(float64(g))), math.Max(xHi, math.Log2(float64(g)))
	}
	if xHi == xLo {
		xHi++
	}
	const (
		width, height         = 960, 540
		left, right, top, bot = 80, 360, 40, 60
	)
	pw, ph := float64(width-left-right), float64(height-top-bot)
	px := func(g int) float64 { return left + (math.Log2(float64(g))-xLo)/(xHi-xLo)*pw }
	py := func(v float64) float64 { return top + (yHi-math.Log10(v))/(yHi-yLo)*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">Throughput against goroutines (median of %d rounds; log–log)</text>`+"\n", left, rep.Config.Rounds)
	// Grid: every decade labelled, 2× and 5× faint.
	for d := yLo; d <= yHi; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if math.Log10(v) > yHi+1e-9 {
				break
			}
			y := py(v)
			stroke := "#eeeeee"
			if m == 1 {
				stroke = "#cccccc"
				fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, rate(v))
			}
			fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s"/>`+"\n", left, left+pw, y, y, stroke)
		}
	}
	for _, g := range gs {
		x := px(g)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%.1f" stroke="#cccccc"/>`+"\n", x, x, top, top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", x, top+ph+18, g)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">goroutines</text>`+"\n", left+pw/2, height-14)
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">messages (or requests) per second</text>`+"\n", top+ph/2)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="#888888"/>`+"\n", left, top, pw, ph)
	for i, r := range rep.Rows {
		color := palette[i%len(palette)]
		dash := ""
		if i >= len(palette) {
			dash = ` stroke-dasharray="6 3"`
		}
		var pts []string
		for gi, t := range r.Throughput {
			if t > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(gs[gi]), py(t)))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
		for _, p := range pts {
			x, y, _ := strings.Cut(p, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", x, y, color)
		}
		ly := float64(top + 10 + i*20)
		lx := float64(width - right + 20)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", lx, lx+24, ly, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", lx+30, ly+4, html.EscapeString(r.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
