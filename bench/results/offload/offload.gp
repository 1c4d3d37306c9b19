set terminal pngcairo size 1100,500
set output "offload.png"
set title "Simulated iteration by the planner's actions (host memory per GPU, datasheet PCIe)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "iteration ms"
set xtics rotate by -20
set key top left
plot "offload.dat" using 2:xtic(1) title "recompute", "" using 3 title "offload", "" using 4 title "recompute,offload"
