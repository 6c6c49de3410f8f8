(function(){
var D=JSON.parse(document.getElementById('data').textContent);
var color=D.colors, tip=document.getElementById('tip'), n=0;
function show(e,t){tip.textContent=t;tip.style.display='block';
 tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';}
function hide(){tip.style.display='none';}
var map=document.getElementById('heatmap');
D.sus.forEach(function(su){
 var box=document.createElement('div');box.className='su';
 var h=document.createElement('b');h.textContent=su.name+' ('+su.nodes+' nodes)';box.appendChild(h);
 su.racks.forEach(function(r){
  var rk=document.createElement('div');rk.className='rack'+(r.hot?' hot':'');
  rk.title=r.name+(r.power?' '+r.power:'');
  r.cells.forEach(function(c){
   var d=document.createElement('i');d.className='c';d.style.background=color[D.states[c[1]]];
   var t=c[0]+' ('+r.name+'): '+D.states[c[1]]+(c[2]?' '+c[2]:'');
   d.onmouseenter=function(e){show(e,t);};d.onmouseleave=hide;rk.appendChild(d);n++;
  });
  box.appendChild(rk);
 });
 map.appendChild(box);
});
var lv=document.getElementById('leaves');
D.leaves.forEach(function(l){
 var d=document.createElement('i');d.className='leaf';
 var bad=l[2]/Math.max(l[1],1);
 d.style.background=bad==0?color.pass:(bad<0.1?color.warn:color.fail);
 var t=l[0]+': '+l[2]+' of '+l[1]+' nodes not passing';
 d.onmouseenter=function(e){show(e,t);};d.onmouseleave=hide;lv.appendChild(d);
});
var done=document.getElementById('rendered');
done.setAttribute('data-cells',String(n));done.textContent=n+' nodes drawn';
})();
