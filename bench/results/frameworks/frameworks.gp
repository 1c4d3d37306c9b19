set terminal pngcairo size 1300,620 noenhanced
set output "frameworks.png"
set bmargin 12
set title "Best plan's simulated step for each target (missing bars: refused or no fit)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set ylabel "step ms (log)"
set xtics rotate by 40 right font ",9"
set key top left font ",9"
plot "frameworks.dat" using 2:xtic(1) title "ballast", "" using 3 title "megatron (per rank)", \
     "" using 4 title "megatron-cli", "" using 5 title "nemo (per rank)", "" using 6 title "nemo-cli", \
     "" using 7 title "colossalai", "" using 8 title "flagscale", "" using 9 title "Ballast plan in Megatron-LM"
